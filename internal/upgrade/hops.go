package upgrade

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// A plan is a list of hops from the release a database is at to the
// release asked for (Options.To, default upstream's newest). Upstream's
// history is one line of files; each hop moves the database one file
// along it. The queue-persistence change (upstream's file 24, 0.16.0 →
// 0.17.0) is this tool's own migration; every other hop runs upstream's
// file from the user's copy (package pgflowfiles). All hops run in apply's
// one transaction, under its advisory lock, ordered table locks,
// lock_timeout and retries; each hop's own checks run just before it,
// under the locks. A new kind of hop joins by a HopKind and a case in
// applyRun.runHop.

// HopKind is how a hop changes the database.
type HopKind string

const (
	// HopOwn is this tool's migration (migrations/): 0.16.0 → 0.17.0.
	HopOwn HopKind = "own"
	// HopUpstream is one of upstream's files, run from the user's copy as
	// it is, statement by statement.
	HopUpstream HopKind = "upstream"
)

// ownHopFile is the upstream file our own migration stands for.
const ownHopFile = versions.OwnHopFile

// Hop is one step of a plan.
type Hop struct {
	Kind HopKind `json:"kind"`
	From string  `json:"from"` // the state before (versions.StateName)
	To   string  `json:"to"`
	// Upstream is the file of upstream's history the hop stands for (for
	// HopOwn: the file our migration replaces, recorded in the ledger).
	Upstream versions.UpstreamFile `json:"-"`
	File     string                `json:"file"`           // upstream's name of that file
	Path     string                `json:"path,omitempty"` // the user's copy run (HopUpstream)
	// Ledger: the Supabase ledger row the hop records, as push would for
	// the user's copy (version_name); "" when there is no copy to name it.
	Ledger string `json:"ledger,omitempty"`
	// Notes: what an operator should know about the hop (what it does
	// beyond functions: locks, scans, the telemetry job).
	Notes []string `json:"notes,omitempty"`
}

// Plan is the hops from the release found to the one asked for.
type Plan struct {
	From      string `json:"from"`
	FromFiles int    `json:"from_files"`
	To        string `json:"to"`
	ToFiles   int    `json:"to_files"`
	// Reached: where the hops end (To, unless upstream's files are not at
	// hand: then where this tool's own hops end).
	Reached      string `json:"reached"`
	ReachedFiles int    `json:"reached_files"`
	Hops         []Hop  `json:"hops"`
	// Rest: what reaching To still needs ("" when the plan reaches it).
	Rest string `json:"rest,omitempty"`
	// Telemetry: what the destination does about pgflow's telemetry job.
	Telemetry string `json:"telemetry,omitempty"`
	// Copy: the folder upstream's files were found in ("" when none).
	Copy string `json:"pgflow_migrations,omitempty"`
}

// TelemetryNote says what a destination at files n does about telemetry.
func TelemetryNote(n int, off bool) string {
	switch {
	case n < 26:
		return ""
	case off:
		return "telemetry off: pgflow_telemetry.disable() runs in the same transaction, no pgflow_telemetry_report job is left"
	}
	return "telemetry: upstream's default: pg_cron job pgflow_telemetry_report runs daily and posts pgflow_telemetry.preview()'s anonymous usage counts (through pg_net); --telemetry=off opts out with upstream's pgflow_telemetry.disable()"
}

// ErrNoUpstreamFiles: the plan needs upstream's files and there are none.
var ErrNoUpstreamFiles = errors.New("this upgrade needs upstream pgflow's own migration files")

// userName splits a copy's file name as the Supabase CLI does: the digits
// before the first underscore are the version, the rest the name.
var userName = regexp.MustCompile(`^([0-9]+)_(.+)\.sql$`)

// ledgerOf is the ledger row push writes for the copy at path.
func ledgerOf(path string) (version, name string, ok bool) {
	m := userName.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// MakePlan plans the hops from upstream's first from files to release
// to. copy is the user's copy of upstream's files (nil when not at hand;
// then the plan ends where this tool's own hops end and Rest says what the
// remainder needs).
func MakePlan(from int, to versions.Release, copy *pgflowfiles.Copy, telemetryOff bool) *Plan {
	all := versions.UpstreamFiles()
	p := &Plan{From: versions.StateName(from), FromFiles: from, To: to.Name, ToFiles: to.Files}
	if copy != nil {
		p.Copy = copy.Dir
	}
	at := from
	for i := from + 1; i <= to.Files; i++ {
		f := all[i-1]
		h := Hop{From: versions.StateName(i - 1), To: versions.StateName(i), Upstream: f, File: f.Name, Notes: versions.FileNotes(i)}
		switch {
		case i == ownHopFile:
			h.Kind = HopOwn
			h.Notes = []string{"this tool's migration " + Version + "_" + Name + " (queue persistence), in place of upstream's file"}
		case copy == nil || len(copy.Files) < i:
			p.Rest = fmt.Sprintf("%s from %s needs upstream's files %d-%d (%s ... %s): pass --pgflow-migrations DIR (your copy of pgflow's migrations, e.g. supabase/migrations after `npx pgflow install`)",
				to.Name, versions.StateName(i-1), i, to.Files, f.Name, all[to.Files-1].Name)
		default:
			h.Kind, h.Path = HopUpstream, copy.File(i).Path
		}
		if p.Rest != "" {
			break
		}
		if copy != nil && len(copy.Files) >= i {
			if v, n, ok := ledgerOf(copy.File(i).Path); ok {
				h.Ledger = v + "_" + n
			}
		}
		p.Hops = append(p.Hops, h)
		at = i
	}
	p.ReachedFiles, p.Reached = at, versions.StateName(at)
	if at >= 26 || to.Files >= 26 {
		p.Telemetry = TelemetryNote(max(at, from), telemetryOff)
	}
	return p
}

// Needs: the plan has hops that run upstream's files.
func (p *Plan) Needs() bool {
	for _, h := range p.Hops {
		if h.Kind == HopUpstream {
			return true
		}
	}
	return false
}

// Has reports whether the plan has a hop of kind k.
func (p *Plan) Has(k HopKind) bool {
	for _, h := range p.Hops {
		if h.Kind == k {
			return true
		}
	}
	return false
}

// Lines is the plan hop by hop, for the human output.
func (p *Plan) Lines() []string {
	var out []string
	for i, h := range p.Hops {
		src := "upstream's " + h.File + " from " + h.Path
		if h.Kind == HopOwn {
			src = "this tool's migration " + Version + "_" + Name + " (for upstream's " + h.File + ")"
		}
		line := fmt.Sprintf("%d. %s -> %s: %s", i+1, h.From, h.To, src)
		if len(h.Notes) > 0 && h.Kind == HopUpstream {
			line += "; " + strings.Join(h.Notes, "; ")
		}
		out = append(out, line)
	}
	if p.Rest != "" {
		out = append(out, "then: "+p.Rest)
	}
	if p.Telemetry != "" {
		out = append(out, p.Telemetry)
	}
	return out
}
