package fleet

import (
	"fmt"
	"sort"
	"strings"
)

// ReportFormat names the JSON report's format.
const ReportFormat = "pgflow-upgrade-fleet/1"

// Verdicts of entries that have no command's answer.
const (
	VerdictUnreachable = "UNREACHABLE" // no answer from the database (exit 3 before its catalog was read)
	VerdictNotStarted  = "NOT STARTED"
	VerdictMissing     = "NOT RUN"    // in the targets file, in no ledger given to `fleet report`
	VerdictUnfinished  = "UNFINISHED" // running when its run's ledger was last written
)

// Exit codes as the command line defines them (internal/cli/exit.go).
const (
	exitOK           = 0
	exitFindings     = 1
	exitUsage        = 2
	exitEnvironment  = 3
	exitInconclusive = 4
	exitInterrupted  = 130
)

// exitOrder ranks exit codes from the worst: a fleet exits with its worst
// target's code. Interrupted first (the run is not over), then a usage
// error and a connection error (the target was not examined at all), then
// findings, then inconclusive, then success.
var exitOrder = []int{exitInterrupted, exitUsage, exitEnvironment, exitFindings, exitInconclusive, exitOK}

// Worst is the worse of two exit codes (a code not in the order is worst).
func Worst(a, b int) int {
	if rank(a) <= rank(b) {
		return a
	}
	return b
}

func rank(code int) int {
	for i, c := range exitOrder {
		if c == code {
			return i
		}
	}
	return -1
}

// Interrupted starts the stop reason of a run ended by SIGINT or SIGTERM.
const Interrupted = "interrupted (SIGINT/SIGTERM)"

// Group is a set of targets in the same state (Entry.StateKey): one review
// of the first covers them all.
type Group struct {
	// Like: the first target of the group in the file.
	Like     string   `json:"like"`
	Size     int      `json:"size"`
	Release  string   `json:"release,omitempty"`
	Summary  string   `json:"summary,omitempty"`
	Verdict  string   `json:"verdict"`
	ExitCode int      `json:"exit_code"`
	Blockers []string `json:"blockers"`
	Warnings []string `json:"warnings"`
	Targets  []string `json:"targets"`
	key      string
}

// Title reads "9 databases in the same state as prod-eu".
func (g *Group) Title() string {
	if g.Size == 1 {
		return g.Like + ", in a state of its own"
	}
	return fmt.Sprintf("%d databases in the same state as %s", g.Size, g.Like)
}

// Describe is the group's state in one line.
func (g *Group) Describe() string {
	parts := []string{g.Summary, g.Verdict}
	if len(g.Blockers) > 0 {
		parts = append(parts, "blockers: "+strings.Join(g.Blockers, ", "))
	}
	if len(g.Warnings) > 0 {
		parts = append(parts, "warnings: "+strings.Join(g.Warnings, ", "))
	}
	return strings.Join(nonEmpty(parts), "; ")
}

// VerdictCount is how many targets got one verdict.
type VerdictCount struct {
	Verdict string `json:"verdict"`
	Count   int    `json:"count"`
}

// Report is the fleet's result: the same from a run's own output and from
// `fleet report` over its ledgers (sharded or not), as it is computed from
// the entries alone.
type Report struct {
	Format   string         `json:"format"`
	Command  string         `json:"command"`
	Verdict  string         `json:"verdict"`
	ExitCode int            `json:"exit_code"`
	Targets  int            `json:"targets"`
	Counts   []VerdictCount `json:"counts"`
	Stopped  []string       `json:"stopped,omitempty"`
	// Groups: the targets that answered, by state, in file order of
	// their first target. Unreached: the rest (unreachable, not started,
	// not run), in file order.
	Groups    []Group  `json:"groups"`
	Unreached []string `json:"unreached"`
	Entries   []Entry  `json:"entries"`
}

// Build makes the report of command over targets (every target of the
// file) from entries (any order; a target without one is "not run").
func Build(command string, targets []TargetRef, entries []Entry, stopped []string) *Report {
	byName := map[string]Entry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	r := &Report{Format: ReportFormat, Command: command, Targets: len(targets), Stopped: stopped,
		Groups: []Group{}, Unreached: []string{}, Entries: []Entry{}}
	code := exitOK
	counts := map[string]int{}
	var order []string
	groupOf := map[string]int{}
	for _, t := range targets {
		e, ok := byName[t.Name]
		if !ok {
			e = Entry{Name: t.Name, Line: t.Line, Database: t.Database, Status: StatusNotStarted, Verdict: VerdictMissing,
				ExitCode: exitInconclusive, Cause: "no ledger given has this target (its shard's ledger is missing)"}
		}
		if e.Status == StatusRunning {
			// A ledger of a run that ended (killed) while this target ran.
			e.Verdict, e.ExitCode = VerdictUnfinished, exitInconclusive
			e.Cause = "the run ended while this target ran (killed?): what it did committed or rolled back; rerun with the ledger"
		}
		r.Entries = append(r.Entries, e)
		if e.Status != StatusNotStarted || e.Verdict == VerdictMissing {
			code = Worst(code, e.ExitCode)
		}
		if counts[e.Verdict] == 0 {
			order = append(order, e.Verdict)
		}
		counts[e.Verdict]++
		key := e.StateKey()
		if key == "" || e.Status == StatusNotStarted || e.Status == StatusRunning {
			r.Unreached = append(r.Unreached, e.Name)
			continue
		}
		i, ok := groupOf[key]
		if !ok {
			i = len(r.Groups)
			groupOf[key] = i
			r.Groups = append(r.Groups, Group{Like: e.Name, Release: e.Release, Summary: e.Summary, Verdict: e.Verdict,
				ExitCode: e.ExitCode, Blockers: checkIDs(e.Blockers), Warnings: checkIDs(e.Warnings), Targets: []string{}, key: key})
		}
		g := &r.Groups[i]
		g.Size++
		g.Targets = append(g.Targets, e.Name)
	}
	sort.SliceStable(order, func(i, j int) bool { return counts[order[i]] > counts[order[j]] })
	for _, v := range order {
		r.Counts = append(r.Counts, VerdictCount{v, counts[v]})
	}
	for _, why := range stopped {
		if strings.HasPrefix(why, Interrupted) {
			code = Worst(code, exitInterrupted)
		}
	}
	r.ExitCode = code
	r.Verdict = FleetVerdict(command, code)
	return r
}

// FleetVerdict is the fleet's answer in a word, from its exit code.
func FleetVerdict(command string, code int) string {
	switch code {
	case exitInterrupted:
		return "INTERRUPTED"
	case exitUsage:
		return "USAGE ERROR"
	}
	switch command {
	case "audit":
		return map[int]string{exitOK: "GO", exitFindings: "NO-GO"}[code] + cannotTell(code)
	case "verify":
		return map[int]string{exitOK: "PASS", exitFindings: "FAIL"}[code] + cannotTell(code)
	case "status":
		return map[int]string{exitOK: "OK", exitFindings: "NEEDS ATTENTION"}[code] + cannotTell(code)
	}
	if code == exitOK {
		return "DONE"
	}
	return "FAILED"
}

func cannotTell(code int) string {
	if code == exitEnvironment || code == exitInconclusive {
		return "CANNOT TELL"
	}
	return ""
}

// CountsLine reads "6 targets: 2 GO, 1 NO-GO, 2 UNREACHABLE".
func (r *Report) CountsLine() string {
	parts := make([]string, len(r.Counts))
	for i, c := range r.Counts {
		parts[i] = fmt.Sprintf("%d %s", c.Count, c.Verdict)
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d targets", r.Targets)
	}
	return fmt.Sprintf("%d targets: %s", r.Targets, strings.Join(parts, ", "))
}

// Entry returns the named target's entry.
func (r *Report) Entry(name string) *Entry {
	for i := range r.Entries {
		if r.Entries[i].Name == name {
			return &r.Entries[i]
		}
	}
	return nil
}

func checkIDs(cs []Count) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Check
	}
	return out
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Merge reads ledgers (one per shard, or one for the whole fleet) and
// returns the report a single unsharded run would have printed, with
// notes for what does not fit together (a shard missing or given twice).
func Merge(paths []string) (*Report, []string, error) {
	var (
		command string
		targets []TargetRef
		entries []Entry
		stopped []string
		notes   []string
		shards  = map[string]string{}
		total   int
	)
	for _, p := range paths {
		l, err := ReadLedger(p)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case command == "":
			command, targets = l.Command, l.Targets
		case l.Command != command:
			return nil, nil, fmt.Errorf("ledger %s records a fleet %s, %s a fleet %s: merge the ledgers of one run", p, l.Command, paths[0], command)
		case Digest(l.Targets) != Digest(targets):
			return nil, nil, fmt.Errorf("ledger %s lists other targets than %s: merge the shards of one targets file", p, paths[0])
		}
		key := l.Shard
		if key == "" {
			key = "1/1"
		}
		if prev, dup := shards[key]; dup {
			return nil, nil, fmt.Errorf("ledgers %s and %s are both shard %s", prev, p, key)
		}
		shards[key] = p
		sh, err := ParseShard(key)
		if err != nil {
			return nil, nil, fmt.Errorf("ledger %s: %w", p, err)
		}
		if total != 0 && sh.N != total {
			return nil, nil, fmt.Errorf("ledger %s is shard %s, another is of %d shards: merge the shards of one run", p, key, total)
		}
		total = sh.N
		entries = append(entries, l.Entries...)
		stopped = append(stopped, l.Stopped...)
	}
	for i := 1; i <= total; i++ {
		if _, ok := shards[fmt.Sprintf("%d/%d", i, total)]; !ok {
			notes = append(notes, fmt.Sprintf("shard %d/%d: no ledger given; its targets are reported as %s", i, total, VerdictMissing))
		}
	}
	return Build(command, targets, entries, stopped), notes, nil
}
