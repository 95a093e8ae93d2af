package sshconn

import (
	"bufio"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/ptytest"
)

// testTerminalPassphrase runs do with TerminalPassphrase asking on a
// pseudo-terminal, where it answers pass to the prompt.
func testTerminalPassphrase(t *testing.T, do func(), pass string) {
	master, slave := ptytest.Open(t)
	terminalPath = slave.Name()
	prompt := make(chan string, 1)
	go func() {
		r := bufio.NewReader(master)
		got, _ := r.ReadString(':')
		prompt <- got
		master.WriteString(pass + "\n")
	}()
	do()
	if p := <-prompt; !strings.Contains(p, "Enter passphrase for key") {
		t.Errorf("prompt %q", p)
	}
}
