# ferry — build, test, benchmark, demo. CGO is off everywhere: ferry is pure Go.
GO       ?= go
export CGO_ENABLED := 0

VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin/ferry

# Every parser's fuzz target, as package:Target:executions. `make test` runs
# each for that many executions as a smoke test (about 5-10 s each on a
# 2-core machine); `make fuzz` runs FUZZSCALE times as many. Budgets are
# execution counts, not durations: with a duration, Go 1.26's fuzz
# coordinator can report a spurious "context deadline exceeded" failure
# when the time runs out mid-execution (go.dev/issue/75804, fixed in 1.27).
FUZZ_TARGETS := \
	./safetensors:FuzzHeader:200000 \
	./safetensors:FuzzIndex:170000 \
	./gguf:FuzzReader:150000 \
	./gguf:FuzzSplit:20000 \
	./gguf/convert:FuzzMMProjConfig:3000 \
	./gguf/convert:FuzzFastTokenizer:100000 \
	./gguf/imatrix:FuzzGGUF:80000 \
	./gguf/imatrix:FuzzLegacy:120000 \
	./merge:FuzzAdapterConfig:150000 \
	./manifest:FuzzManifest:160000 \
	./manifest:FuzzJournal:1500 \
	./manifest:FuzzRecordObject:100000 \
	./store:FuzzRecord:100000 \
	./pipeline:FuzzSpec:20000 \
	./verify:FuzzGGUF:150000 \
	./verify:FuzzConfig:10000 \
	./mlxpack:FuzzParseCTConfig:150000 \
	./mlxpack:FuzzFixedConfig:100000 \
	./mlxpack:FuzzReadShape:200000 \
	./transfer/sshconn:FuzzConfig:60000 \
	./transfer/sshconn:FuzzTarget:60000 \
	./netcheck:FuzzNetlink:60000
FUZZSCALE ?= 1
# The smoke run skips minimising new corpus entries, which would eat its budget.
FUZZFLAGS ?= -fuzzminimizetime 0

# go test runs a subset of go vet's checks before testing unless told not
# to. `make test` runs `make vet` first, the full go vet over the same
# packages and test files, so unit and fuzz-smoke do not repeat it: on a
# cold cache the repeat cost unit 58 CPU seconds (vet facts for every
# dependency) and each fuzz build more (its dependencies are instrumented,
# so their vet facts are not shared with unit's). `make unit` alone skips
# the vet subset; run `make vet` too.
TESTFLAGS ?= -vet=off

# Benchmarks: package:regexp. BENCHTIME=1x keeps the heavy ones to one pass.
BENCHTIME ?= 1x

.PHONY: all build test vet unit fuzz-smoke fuzz cross qemu bench demo clean prebuild tools

# Servers the tests start, built from source into .tools/bin (git-ignored),
# not in go.mod: versitygw is a real S3 gateway over a directory, the other
# side of the store's S3 backend (internal/s3test starts it). The first
# build takes 3-6 minutes on 2 cores; after that `make tools` only checks
# the installed binary's module version.
TOOLS_BIN         := $(CURDIR)/.tools/bin
VERSITYGW_VERSION := v1.8.0

all: build

tools:
	@mkdir -p $(TOOLS_BIN)
	@if $(GO) version -m $(TOOLS_BIN)/versitygw 2>/dev/null | grep -q 'mod[[:space:]]*github.com/versity/versitygw[[:space:]]*$(VERSITYGW_VERSION)[[:space:]]'; then \
		echo "tools: versitygw $(VERSITYGW_VERSION) in $(TOOLS_BIN)"; \
	else \
		echo "tools: installing versitygw $(VERSITYGW_VERSION) into $(TOOLS_BIN) (a few minutes the first time)"; \
		GOBIN=$(TOOLS_BIN) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION); \
	fi

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ferry

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: the files above need formatting" && exit 1)
	$(GO) vet ./...

unit:
	$(GO) test $(TESTFLAGS) -count=1 -timeout 15m ./...

fuzz-smoke:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest##*:} * $(FUZZSCALE) )); \
		echo "fuzz $$pkg $$name ($${n} executions)"; \
		$(GO) test $(TESTFLAGS) $$pkg -run '^$$' -fuzz "^$$name$$" -fuzztime $${n}x $(FUZZFLAGS); \
	done

fuzz:
	$(MAKE) fuzz-smoke FUZZSCALE=30 FUZZFLAGS=

# Does every package build for the platforms users serve on? A check, not a
# release build: without optimisation (-N -l) the compiler still type-checks
# and generates code for every package, about 40 % faster on a cold cache
# (linux/arm64: 72 s vs 120 s on 2 cores); without DWARF debug information
# (-dwarf=false) another 20 % (175 vs 141 CPU seconds a target, cold).
CROSSFLAGS ?= '-gcflags=all=-N -l -dwarf=false'
cross:
	GOOS=darwin GOARCH=arm64 $(GO) build $(CROSSFLAGS) ./...
	GOOS=linux GOARCH=arm64 $(GO) build $(CROSSFLAGS) ./...

# The quantizer's tests (reference vectors, goldens) built for linux/arm64
# and run under qemu-user: there Go may fuse x*y+z into one FMA and
# float-to-int conversions saturate, so bytes that match on amd64 prove
# nothing about arm64. The dependencies are built as `make cross` builds
# them (shared cache: a cold run compiles little more), the package under
# test optimised. Each test binary runs in its package's directory, as go
# test runs it, with -short (fewer of the slowest cases; the full set runs
# natively). Without qemu-aarch64 this fails when CI=true (.ci/run
# installs Debian's qemu-user) and says loudly that it skips otherwise.
# An entry PKG:REGEX runs only that package's tests matching REGEX.
QEMU      ?= qemu-aarch64
QEMU_PKGS := ./gguf/quant
QEMU_PKGS += ./mlxpack:^TestAffine
qemu:
	@if ! command -v $(QEMU) >/dev/null; then \
		if [ "$$CI" = true ]; then echo "qemu: $(QEMU) not found (Debian: apt-get install qemu-user)" >&2; exit 1; fi; \
		echo "qemu: $(QEMU) not found: SKIPPING the linux/arm64 tests of $(QEMU_PKGS) (Debian: apt-get install qemu-user)" >&2; \
		exit 0; \
	fi; \
	set -e; mkdir -p bin/qemu; for e in $(QEMU_PKGS); do \
		p=$${e%%:*}; run=.; case $$e in *:*) run=$${e#*:};; esac; \
		bin=$(CURDIR)/bin/qemu/$$(echo $${p#./} | tr / _).test; \
		GOOS=linux GOARCH=arm64 $(GO) test -c -vet=off $(CROSSFLAGS) -gcflags=$$p= -o $$bin $$p; \
		echo "qemu: $$p tests ($$run) on linux/arm64"; \
		(cd $$p && $(QEMU) $$bin -test.count=1 -test.short -test.timeout=5m -test.run "$$run"); \
	done

# make test runs vet, unit, fuzz-smoke, cross and qemu in that order, and
# while unit runs, the builds of the later steps go on beside it at the
# lowest CPU priority (nice 19), taking only the CPU the tests leave idle
# while they wait on child processes, sshd, lock polls and kill timers:
# fuzz-smoke's instrumented test binaries (every dependency of the package
# is instrumented) and cross's two platforms. They only fill the build cache (their output goes to
# bin/prebuild.log); the steps then run as before, find their packages
# compiled, and report any failure themselves.
test: tools vet
	@mkdir -p bin; nice -n 19 $(MAKE) --no-print-directory prebuild >bin/prebuild.log 2>&1 & pre=$$!; \
	$(MAKE) --no-print-directory unit; rc=$$?; wait $$pre; exit $$rc
	@$(MAKE) --no-print-directory fuzz-smoke cross qemu

# The builds of fuzz-smoke (one test binary a package: the instrumented
# packages are the same whichever target runs) and of cross.
prebuild:
	-@seen=; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; \
		case " $$seen " in *" $$pkg "*) continue;; esac; seen="$$seen $$pkg"; \
		$(GO) test $(TESTFLAGS) -c -o /dev/null -run '^$$' -fuzz "^$$name$$" $$pkg; \
	done
	-@$(MAKE) --no-print-directory cross

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 60m ./...

# The main job on the bundled tiny Qwen3.5 + DoRA example: import, merge
# (MTP head kept), GGUF F16, MTP gate. A second `make demo` skips every stage.
demo: build
	$(BIN) pipeline run pipelines/demo.yaml
	$(BIN) verify mtp pipelines/out/merged pipelines/out/gguf/*.gguf

# The whole Jarvis_2 flow, pipelines/jarvis2.yaml as users copy it, on the
# bundled tiny example, shipped over SSH to two sshd servers started on
# 127.0.0.1 for the purpose; a second run must skip every stage, and the
# outputs are checked locally and on both destinations (pipelines/demo-full.sh).
# Then the same flow killed with SIGKILL at random points of every stage
# and run again each time (TestKillAnywhere, about a minute on 2 cores), and
# the same file on a generated vision-language base, whose vision tower
# ships as an mmproj next to the quants (TestJarvis2VisionLanguage, 25 s).
.PHONY: demo-full
demo-full: build
	FERRY=$(BIN) GO=$(GO) pipelines/demo-full.sh
	FERRY_KILL_ANYWHERE=1 $(GO) test $(TESTFLAGS) -count=1 -timeout 15m -run '^TestKillAnywhere$$' -v ./pipeline
	FERRY_JARVIS2_VL=1 $(GO) test $(TESTFLAGS) -count=1 -timeout 5m -run '^TestJarvis2VisionLanguage$$' ./pipeline

clean:
	rm -rf bin
