package cli

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// peakRSSVar, set to 1, makes the tool print its peak resident set size
// (VmHWM of /proc/self/status) on stderr when the command ends: how the
// tests measure the memory a command needs (getrusage's ru_maxrss of a
// child also counts its parent's peak on Linux, through exec).
const peakRSSVar = "PGFLOW_UPGRADE_PEAK_RSS"

func (a *App) reportPeakRSS() {
	if a.Getenv(peakRSSVar) != "1" {
		return
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		fmt.Fprintf(a.Stderr, "pgflow-upgrade: peak RSS unknown: %v\n", err)
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			fmt.Fprintf(a.Stderr, "pgflow-upgrade: peak RSS %s\n", strings.TrimSpace(v))
			return
		}
	}
}
