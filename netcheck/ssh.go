package netcheck

import (
	"github.com/ferry-llm/ferry/transfer/sshconn"
)

// SSHTarget is the Target for an SSH endpoint as sshconn resolved it from
// the user's ssh_config (alias → HostName, Port): the host this machine's
// connection really goes to. With ProxyJump that is the first jump host,
// the only one whose route, interface and path MTU are this machine's
// business; Name then says so.
func SSHTarget(e *sshconn.Endpoint) Target {
	first := e
	for range maxJumpHops {
		if len(first.Jumps) == 0 {
			break
		}
		first = first.Jumps[0]
	}
	t := Target{Name: e.Name, Host: first.HostName, Port: first.Port}
	if first != e {
		t.Name = e.Name + ", first hop " + first.Name
	}
	return t
}

// maxJumpHops bounds the walk down a ProxyJump chain (sshconn bounds the
// chain itself; this only keeps the loop finite).
const maxJumpHops = 16
