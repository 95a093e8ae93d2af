# ferry — build, test, benchmark, demo. CGO is off everywhere: ferry is pure Go.
GO       ?= go
export CGO_ENABLED := 0

VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin/ferry

# Every parser's fuzz target, as package:Target. `make test` runs each for
# FUZZTIME as a smoke test; `make fuzz` runs each for FUZZLONG.
FUZZ_TARGETS := \
	./safetensors:FuzzHeader \
	./safetensors:FuzzIndex \
	./gguf:FuzzReader \
	./merge:FuzzAdapterConfig \
	./manifest:FuzzManifest \
	./manifest:FuzzJournal \
	./pipeline:FuzzSpec \
	./verify:FuzzGGUF \
	./verify:FuzzConfig \
	./mlxpack:FuzzParseCTConfig \
	./mlxpack:FuzzReadShape
FUZZTIME ?= 10s
FUZZLONG ?= 5m
# The smoke run skips minimising new corpus entries, which would eat its 10 s.
FUZZFLAGS ?= -fuzzminimizetime 0

# Benchmarks: package:regexp. BENCHTIME=1x keeps the heavy ones to one pass.
BENCHTIME ?= 1x

.PHONY: all build test vet unit fuzz-smoke fuzz cross bench demo clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ferry

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: the files above need formatting" && exit 1)
	$(GO) vet ./...

unit:
	$(GO) test -count=1 -timeout 15m ./...

fuzz-smoke:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
	done

fuzz:
	$(MAKE) fuzz-smoke FUZZTIME=$(FUZZLONG) FUZZFLAGS=

cross:
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=linux GOARCH=arm64 $(GO) build ./...

test: vet unit fuzz-smoke cross

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 60m ./...

# The main job on the bundled tiny Qwen3.5 + DoRA example: import, merge
# (MTP head kept), GGUF F16, MTP gate. A second `make demo` skips every stage.
demo: build
	$(BIN) pipeline run pipelines/demo.yaml
	$(BIN) verify mtp pipelines/out/merged pipelines/out/gguf/*.gguf

clean:
	rm -rf bin
