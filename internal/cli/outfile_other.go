//go:build !linux

package cli

import "os"

// rename moves from to to (the target was checked just before).
func rename(from, to string, _ bool) error { return os.Rename(from, to) }
