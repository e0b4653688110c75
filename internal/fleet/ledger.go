package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// LedgerFormat names the ledger file's format.
const LedgerFormat = "pgflow-upgrade-fleet-ledger/1"

// TargetRef is a target as the ledger lists it: enough for `fleet report`
// to name the targets of a shard whose ledger is missing.
type TargetRef struct {
	Name     string `json:"name"`
	Line     int    `json:"line"`
	Database string `json:"database"`
}

// Ledger is the small JSON file a fleet run keeps (--ledger FILE): every
// target of the file, and each outcome of this shard's targets with its
// times. It is rewritten whole and atomically after every change, so a run
// that is killed leaves the ledger of its last finished target, and a rerun
// resumes from it.
type Ledger struct {
	Format  string      `json:"format"`
	Command string      `json:"command"`
	Shard   string      `json:"shard,omitempty"`
	Targets []TargetRef `json:"targets"`
	// Stopped: why this run started no more targets (a canary failed, the
	// failure limit, an interrupt).
	Stopped   []string  `json:"stopped,omitempty"`
	Entries   []Entry   `json:"entries"`
	UpdatedAt time.Time `json:"updated_at"`

	path     string
	mu       sync.Mutex
	previous map[string]Entry
}

// Refs lists targets as the ledger keeps them.
func Refs(targets []Target) []TargetRef {
	out := make([]TargetRef, len(targets))
	for i, t := range targets {
		out[i] = TargetRef{Name: t.Name, Line: t.Line, Database: t.Database}
	}
	return out
}

// OpenLedger starts the ledger at path for a run of command over all (the
// whole file) in shard. An existing ledger must be of the same command
// and shard: its entries are what Previous answers from, and the new run
// starts from them. path "" keeps the ledger in memory only.
func OpenLedger(path, command string, shard Shard, all []Target) (*Ledger, error) {
	l := &Ledger{Format: LedgerFormat, Command: command, Shard: shard.String(), Targets: Refs(all), path: path, previous: map[string]Entry{}}
	if path == "" {
		return l, nil
	}
	old, err := ReadLedger(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, l.write()
	}
	if err != nil {
		return nil, err
	}
	if old.Command != command {
		return nil, fmt.Errorf("ledger %s records a fleet %s, not a fleet %s: give this run its own --ledger file", path, old.Command, command)
	}
	if old.Shard != l.Shard {
		return nil, fmt.Errorf("ledger %s is shard %q's, this run is shard %q's: give each shard its own --ledger file", path, old.Shard, l.Shard)
	}
	mine := map[string]bool{}
	for _, t := range all {
		mine[t.Name] = true
	}
	for _, e := range old.Entries {
		if mine[e.Name] {
			// Kept until this run records the target again: a run killed
			// before reaching it loses nothing of what the ledger knew.
			l.previous[e.Name] = e
			l.Entries = append(l.Entries, e)
		}
	}
	return l, l.write()
}

// ReadLedger reads a ledger file.
func ReadLedger(path string) (*Ledger, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l Ledger
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("ledger %s is not a fleet ledger (%v): give a file written by --ledger", path, err)
	}
	if l.Format != LedgerFormat {
		return nil, fmt.Errorf("ledger %s: format %q, want %q", path, l.Format, LedgerFormat)
	}
	return &l, nil
}

// Previous is what an earlier run recorded for target t, when it was
// recorded for the same database; nil otherwise.
func (l *Ledger) Previous(t Target) *Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.previous[t.Name]
	if !ok || e.Database != t.Database {
		return nil
	}
	return &e
}

// Record puts e in the ledger (replacing the target's earlier entry) and
// writes the file.
func (l *Ledger) Record(e Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	replaced := false
	for i := range l.Entries {
		if l.Entries[i].Name == e.Name {
			l.Entries[i], replaced = e, true
		}
	}
	if !replaced {
		l.Entries = append(l.Entries, e)
		sort.SliceStable(l.Entries, func(i, j int) bool { return l.Entries[i].Line < l.Entries[j].Line })
	}
	return l.write()
}

// Stop records why the run started no more targets.
func (l *Ledger) Stop(reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Stopped = append(l.Stopped, reason)
	return l.write()
}

// Snapshot is a copy of the entries and stop reasons recorded so far.
func (l *Ledger) Snapshot() (entries []Entry, stopped []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Entry(nil), l.Entries...), append([]string(nil), l.Stopped...)
}

// write replaces the file atomically: a new file in the same directory,
// fsynced, renamed over the old one, the directory fsynced. Called with mu.
func (l *Ledger) write() error {
	if l.path == "" {
		return nil
	}
	l.UpdatedAt = time.Now().UTC()
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(l.path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(l.path)+".*")
	if err != nil {
		return fmt.Errorf("writing the ledger %s: %w", l.path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("writing the ledger %s: %w", l.path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing the ledger %s: %w", l.path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the ledger %s: %w", l.path, err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("writing the ledger %s: %w", l.path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
