package cli

import "os"

// IsTerminal reports whether f is a character device (a terminal), without
// a dependency: prompts and progress only go to a person.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
