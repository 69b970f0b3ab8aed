package testenv

import (
	"os/exec"

	"yirangmq/backends/backendtest"
)

// EmulatorEnv names the command line that runs a test binary built for
// another architecture (backendtest.EmulatorEnv).
const EmulatorEnv = backendtest.EmulatorEnv

// SelfCommand returns the command that runs this test binary again with
// args, under the emulator of EmulatorEnv when one is set
// (backendtest.SelfCommand).
func SelfCommand(args ...string) *exec.Cmd { return backendtest.SelfCommand(args...) }
