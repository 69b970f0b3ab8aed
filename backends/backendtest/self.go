package backendtest

import (
	"os"
	"os/exec"
	"strings"
)

// EmulatorEnv names the command line that runs a test binary built for
// another architecture, such as "qemu-arm -L /usr/arm-linux-gnueabihf"
// (make test-cross sets it). A test that runs its own binary again must
// start the child through it: without binfmt_misc the kernel cannot run a
// foreign binary by itself.
const EmulatorEnv = "YIRANGMQ_TEST_EMULATOR"

// SelfCommand returns the command that runs this test binary again with
// args, under the emulator of EmulatorEnv when one is set. (It lives here,
// not in testenv, so that no package of the backends imports the test
// harness; testenv.SelfCommand is this one.)
func SelfCommand(args ...string) *exec.Cmd {
	emu := strings.Fields(os.Getenv(EmulatorEnv))
	if len(emu) == 0 {
		return exec.Command(os.Args[0], args...)
	}
	return exec.Command(emu[0], append(append(emu[1:], os.Args[0]), args...)...)
}
