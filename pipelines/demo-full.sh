#!/usr/bin/env bash
# make demo-full: pipelines/jarvis2.yaml, as users copy it, run on the
# bundled tiny Qwen3.5 + DoRA example and shipped to two SSH destinations on
# this machine. Only variables change (--var); the file is the one users get.
#
# Two OpenSSH sshd servers are started on 127.0.0.1 (free ports), each with
# its own host key, and stopped when the script ends. The client side lives
# in a temporary HOME: ~/.ssh/config with the Host aliases ferry-demo-a and
# ferry-demo-b, ~/.ssh/known_hosts with both host keys, and a client key, so
# ferry reads SSH settings exactly as it reads a user's. No ssh-agent is used.
#
# The pipeline runs twice: the first run makes every stage (or, after an
# earlier `make demo-full`, finds them made), the second must skip every
# stage. Then the outputs are checked: the GGUFs read back (ferry inspect,
# and gguf-parser-go through gguf/internal/ggufcheck's test),
# every artifact's MTP head (ferry verify mtp), and every file on both
# destinations has the digest the store recorded for it.
#
# The destinations are pipelines/out/demo-full/{a,b}/jarvis2 (kept, like
# the store pipelines/.ferry and the views in pipelines/out), so a second
# `make demo-full` is a no-op too. Needs openssh-server (sshd, ssh-keygen).
set -euo pipefail
cd "$(dirname "$0")/.."

FERRY=${FERRY:-bin/ferry}
PIPELINE=pipelines/jarvis2.yaml
fail() { echo "demo-full: $*" >&2; exit 1; }

SSHD=$(command -v sshd || true)
for p in /usr/sbin/sshd /usr/local/sbin/sshd /sbin/sshd; do
	[[ -n $SSHD ]] || { [[ -x $p ]] && SSHD=$p; }
done
[[ -n $SSHD ]] || fail "OpenSSH sshd not found (Debian: apt-get install openssh-server)"
command -v ssh-keygen >/dev/null || fail "ssh-keygen not found (Debian: apt-get install openssh-client)"
[[ -x $FERRY ]] || fail "$FERRY not built (make build)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-full.XXXXXX")
pids=()
cleanup() {
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT

# As root, sshd wants its privilege-separation directory, which only the
# service's init script makes.
if [[ $(id -u) == 0 && ! -d /run/sshd ]]; then
	mkdir -p /run/sshd && chmod 0755 /run/sshd
fi

home=$tmp/home
mkdir -p "$home/.ssh"
chmod 700 "$home/.ssh"
ssh-keygen -q -t ed25519 -N '' -C ferry-demo-client -f "$home/.ssh/id_ed25519"
cp "$home/.ssh/id_ed25519.pub" "$tmp/authorized_keys"
: >"$home/.ssh/known_hosts"
: >"$home/.ssh/config"

# start_sshd NAME: an sshd on a free port of 127.0.0.1, known as ferry-demo-NAME.
start_sshd() {
	local name=$1 dir=$tmp/sshd-$1 port pid
	mkdir -p "$dir"
	ssh-keygen -q -t ed25519 -N '' -C "ferry-demo-$name" -f "$dir/host_key"
	for _ in $(seq 1 20); do
		port=$((20000 + RANDOM % 40000))
		cat >"$dir/sshd_config" <<-EOF
			ListenAddress 127.0.0.1:$port
			HostKey $dir/host_key
			AuthorizedKeysFile $tmp/authorized_keys
			PidFile $dir/sshd.pid
			UsePAM no
			StrictModes no
			PermitRootLogin prohibit-password
			PasswordAuthentication no
			KbdInteractiveAuthentication no
			MaxStartups 256
			MaxSessions 256
			Subsystem sftp internal-sftp
		EOF
		"$SSHD" -D -e -f "$dir/sshd_config" 2>"$dir/log" &
		pid=$!
		for _ in $(seq 1 100); do
			grep -q "Server listening" "$dir/log" && break
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
		if grep -q "Server listening" "$dir/log"; then
			pids+=("$pid")
			echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$dir/host_key.pub")" >>"$home/.ssh/known_hosts"
			cat >>"$home/.ssh/config" <<-EOF
				Host ferry-demo-$name
				    HostName 127.0.0.1
				    Port $port
				    User $(id -un)
				    IdentityFile $home/.ssh/id_ed25519
				    IdentitiesOnly yes
			EOF
			echo "demo-full: sshd ferry-demo-$name on 127.0.0.1:$port (pid $pid)"
			return
		fi
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		grep -q "Address already in use" "$dir/log" || fail "sshd did not start: $(cat "$dir/log")"
	done
	fail "no free port for sshd"
}
start_sshd a
start_sshd b

remote=$PWD/pipelines/out/demo-full
vars=(
	--var BASE=../testdata/models/qwen35-tiny/base
	--var ADAPTER=../testdata/models/qwen35-tiny/adapter-dora
	--var NAME=Jarvis2-tiny
	--var IMATRIX=../gguf/imatrix/testdata/qwen35-imatrix.gguf
	--var "TARGETS=ferry-demo-a:$remote/a/jarvis2,ferry-demo-b:$remote/b/jarvis2"
)
ferry() { HOME=$home SSH_AUTH_SOCK='' "$FERRY" "$@"; }

echo "demo-full: ferry pipeline run $PIPELINE ${vars[*]}"
ferry pipeline run "${vars[@]}" "$PIPELINE"

echo "demo-full: second run: every stage must be skipped"
second=$(ferry pipeline run --json "${vars[@]}" "$PIPELINE")
stages=$(grep -c '"action": ' <<<"$second")
skipped=$(grep -c '"action": "skip"' <<<"$second")
if ((stages == 0 || skipped != stages)); then
	echo "$second" >&2
	fail "second run: $skipped of $stages stages skipped"
fi
echo "demo-full: second run: $skipped of $stages stages skipped"

# The outputs.
status=$(ferry pipeline status --json "${vars[@]}" "$PIPELINE")
shopt -s nullglob
ggufs=(pipelines/out/jarvis2/gguf/*.gguf pipelines/out/jarvis2/quants/*.gguf)
((${#ggufs[@]} >= 3)) || fail "expected the F16 GGUF and two K-quants, found: ${ggufs[*]}"
for g in "${ggufs[@]}"; do
	ferry inspect "$g" >/dev/null
done
# And with an independent reader, gguf-parser-go (a test dependency).
GO=${GO:-go}
if ! command -v "$GO" >/dev/null; then fail "go not found: it runs the gguf-parser-go check"; fi
FERRY_GGUFCHECK_FILES=$(IFS=:; echo "${ggufs[*]/#/$PWD/}") \
	"$GO" test -count=1 -run '^TestFilesParseWithGGUFParserGo$' ./gguf/internal/ggufcheck
ferry verify mtp --require pipelines/out/jarvis2/merged pipelines/out/jarvis2/mlx "${ggufs[@]}"

# Every file on each destination is one the store recorded, digest for
# digest, and each destination has as many files as were shipped.
for h in a b; do
	dir=$remote/$h/jarvis2
	[[ -d $dir ]] || fail "nothing at destination $h ($dir)"
	n=0
	while IFS= read -r -d '' f; do
		sum=$(sha256sum "$f" | cut -d' ' -f1)
		grep -q "\"digest\": \"sha256:$sum\"" <<<"$status" || fail "$f: sha256 $sum is not a digest the store recorded"
		n=$((n + 1))
	done < <(find "$dir" -type f -print0)
	((n > 0)) || fail "no files at destination $h"
	echo "demo-full: destination $h: $n files, each with the store's digest"
done
echo "demo-full: ok"
