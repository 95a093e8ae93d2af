package manifest

import (
	"encoding/json"
	"os/exec"
	"testing"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("cannot start a child process: %v", err)
	}
	return cmd.Process.Pid
}
