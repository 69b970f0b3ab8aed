package testenv

import (
	"os"
	"slices"
	"testing"
)

// TestSelfCommand: without an emulator the child is this binary; with one,
// the emulator's words come first and this binary is its program.
func TestSelfCommand(t *testing.T) {
	t.Setenv(EmulatorEnv, "")
	c := SelfCommand("-test.run=^X$")
	if want := []string{os.Args[0], "-test.run=^X$"}; !slices.Equal(c.Args, want) {
		t.Errorf("no emulator: args %q, want %q", c.Args, want)
	}
	t.Setenv(EmulatorEnv, "  qemu-arm -L /usr/arm-linux-gnueabihf  -cpu cortex-a7 ")
	c = SelfCommand("-test.run=^X$", "-test.v")
	want := []string{"qemu-arm", "-L", "/usr/arm-linux-gnueabihf", "-cpu", "cortex-a7", os.Args[0], "-test.run=^X$", "-test.v"}
	if !slices.Equal(c.Args, want) {
		t.Errorf("with an emulator: args %q, want %q", c.Args, want)
	}
}
