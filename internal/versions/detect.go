package versions

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions/onlineshape"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions/quiescerecord"
)

// Detection is which pgflow a database has, and what to do next. Its JSON
// form is the `pgflow_version` object of status, audit and apply.
type Detection struct {
	// Found is the version's name ("0.16.0", "0.17.1+", ...), "" when none.
	Found string `json:"found"`
	State State  `json:"state"`
	// Exact: the catalog is the description, nothing added (Found only).
	Exact bool `json:"exact"`
	// Closest: for an unknown schema, the known version it differs least from.
	Closest string `json:"closest,omitempty"`
	// Differences: for an unknown schema, what a required object of Closest
	// lacks or has differently (catalog.Missing); empty otherwise.
	Differences []catalog.Difference `json:"differences"`
	// Additions: what the database has beyond the description of Found
	// (users' own indexes, constraints, functions...): tolerated, listed.
	Additions []catalog.Difference `json:"additions,omitempty"`
	// Online: an unfinished `apply --online` of ours (Detect reads its
	// objects from the catalog, package onlineshape): State is then StateOnline,
	// and Found, Closest and Differences stay what the catalog matched.
	Online *Online `json:"online,omitempty"`
	// Quiesce: an `apply --quiesce` whose record is still open (it was
	// killed or crashed before its restore): the worker functions and cron
	// jobs it recorded stay disabled and paused until it is finished or
	// undone. It does not change State; NextStep names its two commands.
	// Nil also when the role cannot read the record (audit says so).
	Quiesce  *Quiesce `json:"quiesce,omitempty"`
	NextStep string   `json:"next_step"`
	// Shallow: a pgflow table was locked (by another session, ACCESS
	// EXCLUSIVE) past the lock timeout, so constraint, index and trigger
	// definitions were compared by name only (catalog.ReadShallow).
	Shallow bool `json:"shallow,omitempty"`
	// Release: where the database sits on upstream's line of files (the
	// exact release or prefix, release_detect.go); nil when no known
	// version was found.
	Release *ReleaseState `json:"release,omitempty"`

	// Version is the description of Found (nil when none).
	Version *Version `json:"-"`
	// Catalog is what was read (nil when there is no schema pgflow).
	Catalog *catalog.Catalog `json:"-"`
}

// Online is an unfinished online upgrade: its phase and the commands that
// continue or undo it.
type Online struct {
	Phase    string `json:"phase"`
	Continue string `json:"continue"`
	Undo     string `json:"undo,omitempty"`
}

// Quiesce is an open apply --quiesce record (package quiescerecord): its phase,
// what it recorded, and the commands that finish or undo it.
type Quiesce struct {
	Phase     string    `json:"phase"`
	Since     time.Time `json:"since"`
	Functions int       `json:"functions"` // worker functions recorded (and disabled)
	CronJobs  int       `json:"cron_jobs"` // cron jobs recorded (and paused)
	Resume    string    `json:"resume"`
	Undo      string    `json:"undo"`
}

// NewQuiesce summarises a recorded quiesce.
func NewQuiesce(s *quiescerecord.State) *Quiesce {
	q := &Quiesce{Phase: string(s.Phase), Since: s.StartedAt, Resume: quiescerecord.ResumeCommand(s.Mode), Undo: quiescerecord.UndoCommand}
	q.Functions, q.CronJobs = s.Counts()
	return q
}

// SetQuiesce records an open quiesce record; the next step follows it.
func (d *Detection) SetQuiesce(q *Quiesce) {
	d.Quiesce = q
	d.NextStep = nextStep(d)
}

// Commands that continue or undo an online upgrade (internal/cli).
const (
	ContinueOnline = "pgflow-upgrade apply --online"
	UndoOnline     = "pgflow-upgrade apply --rollback-online"
)

// SetOnline records an online upgrade in progress at phase; the state and
// next step follow it, what was found stays.
func (d *Detection) SetOnline(phase string) {
	d.Online = &Online{Phase: phase, Continue: ContinueOnline, Undo: UndoOnline}
	d.State = StateOnline
	d.NextStep = nextStep(d)
}

// Summary is one line: the version found (or not) and its state.
func (d *Detection) Summary() string {
	switch d.State {
	case StateNotPgflow:
		return "no pgflow schema"
	case StateOnline:
		return fmt.Sprintf("online upgrade of ours in progress (phase %s)", d.Online.Phase)
	case StateUnknown:
		if d.Closest == "" {
			return "unknown pgflow schema"
		}
		return fmt.Sprintf("unknown pgflow schema, closest to %s (%d differences)", d.Closest, len(d.Differences))
	}
	s := "pgflow " + d.Found
	if !d.Exact {
		s += fmt.Sprintf(" (with %d additions)", len(d.Additions))
	}
	if d.Shallow {
		s += " (a pgflow table is locked: definitions compared by name only)"
	}
	return s
}

// PlanStarts says whether a plan to upstream's newest release may start
// here: a known release (or a prefix of upstream's files) below the newest,
// told exactly, whose Supabase ledger raises no refusal, with no online
// upgrade of ours under way. Older releases are on the road too: apply runs
// upstream's files from the user's copy up to 0.16.0, then its own hop.
func (d *Detection) PlanStarts() bool {
	if d == nil || d.Release == nil || d.Online != nil || d.Release.AtNewest() || d.Release.Refusal() != "" {
		return false
	}
	return d.State == StateOlder || d.State == StateReady || d.State == StateUpgraded
}

// DifferenceStrings renders Differences one per item.
func (d *Detection) DifferenceStrings() []string { return catalog.Strings(d.Differences) }

// Detect reads the live catalog of schema pgflow once (catalog.Read: one
// read-only catalog query, no table locks) and says which version it is.
// A 0.16.0 schema (with or without differences) that holds the objects of
// an unfinished `apply --online` of ours is that online upgrade in
// progress (StateOnline), named with its phase.
func Detect(ctx context.Context, q catalog.Querier) (*Detection, error) {
	ok, err := catalog.Exists(ctx, q, Schema)
	if err != nil {
		return nil, fmt.Errorf("detecting the pgflow version: %w", err)
	}
	if !ok {
		d := &Detection{State: StateNotPgflow, Differences: []catalog.Difference{}}
		d.NextStep = nextStep(d)
		return d, nil
	}
	c, err := catalog.Read(ctx, q, Schema)
	if catalog.IsLockTimeout(err) {
		// Deparsing waits for ACCESS SHARE on each table; rather than fail
		// (audit must work while apply holds its locks), compare by name.
		c, err = catalog.ReadShallow(ctx, q, Schema)
	}
	if err != nil {
		return nil, fmt.Errorf("detecting the pgflow version: %w", err)
	}
	return DetectCatalog(ctx, q, c)
}

// DetectCatalog is Detect on schema pgflow's catalog c, already read from
// q (in the same transaction): what else detection reads (an online
// upgrade's objects, the release's digests and ledger, an open quiesce
// record) is read from q. One catalog read then serves both a caller's own
// comparison and the detection.
func DetectCatalog(ctx context.Context, q catalog.Querier, c *catalog.Catalog) (*Detection, error) {
	d := Classify(c)
	d.Shallow = c.Shallow
	if d.State == StateReady || d.State == StateUnknown {
		// Only these can be one: a 0.17.x schema has queue_name columns of
		// its own, and the shape alone cannot tell them from a backfill.
		s, err := onlineshape.Read(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("detecting the pgflow version: %w", err)
		}
		if s.InProgress() {
			d.SetOnline(string(s.Phase()))
		}
	}
	var err error
	if d.Release, err = DetectRelease(ctx, q, d); err != nil {
		return nil, fmt.Errorf("detecting the pgflow release: %w", err)
	}
	d.NextStep = nextStep(d)
	rec, _, err := quiescerecord.Find(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("detecting the pgflow version: %w", err)
	}
	if rec != nil {
		d.SetQuiesce(NewQuiesce(rec))
	}
	return d, nil
}

// Classify says which known version c is. A version matches when nothing
// it requires is missing or different (catalog.Missing: users' additions
// are tolerated); when several would, the one with the fewest additions
// wins. Otherwise the schema is unknown and the closest version (fewest
// differences; the newer on a tie) is named with what differs.
func Classify(c *catalog.Catalog) *Detection {
	d := &Detection{Catalog: c, Differences: []catalog.Difference{}}
	var best *Version
	var bestAdd []catalog.Difference
	for _, v := range All() {
		if len(catalog.Missing(v.Catalog, c)) > 0 {
			continue
		}
		add := additions(v.Catalog, c)
		if best == nil || len(add) < len(bestAdd) {
			best, bestAdd = v, add
		}
	}
	switch {
	case best != nil:
		d.Found, d.State, d.Version, d.Additions, d.Exact = best.Name, best.State, best, bestAdd, len(bestAdd) == 0
	default:
		d.State = StateUnknown
		if len(c.Tables) == 0 {
			d.Differences = append(d.Differences, catalog.Difference{Kind: catalog.KindSchema, Name: Schema, Object: Schema,
				Change: catalog.ChangeChanged, Field: "tables", Want: "pgflow's tables", Got: "none"})
			break
		}
		var closest []catalog.Difference
		for _, v := range All() {
			m := catalog.Missing(v.Catalog, c)
			if d.Closest == "" || len(m) <= len(closest) {
				d.Closest, closest = v.Name, m
			}
		}
		d.Differences = closest
	}
	d.NextStep = nextStep(d)
	return d
}

// additions: what c has beyond want (Diff's extras; the pgmq version is
// not an addition).
func additions(want, c *catalog.Catalog) []catalog.Difference {
	all := catalog.Diff(want, c)
	return slices.DeleteFunc(all, func(x catalog.Difference) bool { return x.Change != catalog.ChangeExtra })
}

func nextStep(d *Detection) string {
	if q := d.Quiesce; q != nil {
		return fmt.Sprintf("an interrupted `pgflow-upgrade apply --quiesce` left its record open (phase %s, since %s): the %d worker function(s) and %d cron job(s) it recorded stay disabled and paused until it is closed; "+
			"run `%s` to finish it (it continues from its phase, upgrades if that is not done, and restores the recorded values), or `%s` to restore them without upgrading",
			q.Phase, q.Since.UTC().Format(time.RFC3339), q.Functions, q.CronJobs, q.Resume, q.Undo)
	}
	switch d.State {
	case StateNotPgflow:
		return "no pgflow schema in this database: point --dsn at the right database (there is nothing to upgrade here)"
	case StateOlder:
		if d.PlanStarts() {
			return fmt.Sprintf("pgflow %s; upstream's newest release is %s: run `pgflow-upgrade audit`, then `pgflow-upgrade apply --pgflow-migrations DIR` (DIR: your copy of pgflow's migrations, e.g. supabase/migrations after `npx pgflow install`; "+
				"upstream's files take it to 0.16.0, this tool's own hop to 0.17.0, upstream's files the rest)", d.Release.Name, d.Release.Newest)
		}
		return fmt.Sprintf("pgflow %s is older than 0.16.0 and its release could not be told exactly: upgrade pgflow to 0.16.0 first with pgflow's own installer (its migrations up to %s), then run `pgflow-upgrade audit`",
			d.Found, MustLookup(V0_16_0).Last().File())
	case StateReady:
		return "ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`"
	case StateUpgraded:
		if r := d.Release; r != nil && !r.AtNewest() {
			return fmt.Sprintf("pgflow %s; upstream's newest release is %s: run `pgflow-upgrade audit`, then `pgflow-upgrade apply --pgflow-migrations DIR` (DIR: your copy of pgflow's migrations, e.g. supabase/migrations after `npx pgflow install`)",
				r.Name, r.Newest)
		}
		if r := d.Release; r != nil {
			return fmt.Sprintf("already upgraded: pgflow %s, upstream's newest release: nothing to do", r.Name)
		}
		return fmt.Sprintf("already upgraded (pgflow %s, by this tool or by pgflow's own migration): nothing to do", d.Found)
	case StateOnline:
		return fmt.Sprintf("an online upgrade of ours is in progress (phase %s): run `%s` to continue it, or `%s` to undo it",
			d.Online.Phase, d.Online.Continue, d.Online.Undo)
	}
	if d.Closest == "" {
		return "schema pgflow does not look like pgflow: nothing this tool can upgrade"
	}
	return fmt.Sprintf("not a pgflow version this tool knows: closest is %s, from which it differs in %d ways (listed); restore those objects (or the database) before upgrading",
		d.Closest, len(d.Differences))
}
