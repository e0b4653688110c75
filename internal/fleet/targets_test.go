package fleet

import (
	"strings"
	"testing"
)

func TestParseTargets(t *testing.T) {
	in := `# the fleet
prod-eu postgres://app:S3cret-pw@db.eu:5432/app
  postgres://app@db.us/app   
staging	host=stage.internal dbname=app user=app password=S3cret-pw

host=tenant7 dbname=t7
`
	ts, err := ParseTargets(strings.NewReader(in), "targets.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		line int
		pw   bool
	}{{"prod-eu", 2, true}, {"db.us/app", 3, false}, {"staging", 4, true}, {"tenant7/t7", 6, false}}
	if len(ts) != len(want) {
		t.Fatalf("%d targets: %+v", len(ts), ts)
	}
	for i, w := range want {
		if ts[i].Name != w.name || ts[i].Line != w.line || ts[i].HasPassword != w.pw || strings.Contains(ts[i].Database, "S3cret") {
			t.Errorf("target %d: %+v, want %+v", i, ts[i], w)
		}
	}
	if w := ExposedPasswords(ts, 0o644, "targets.txt"); !strings.Contains(w, "2 password(s)") || !strings.Contains(w, "chmod 600") {
		t.Errorf("mode 0644: %q", w)
	}
	if w := ExposedPasswords(ts, 0o600, "targets.txt"); w != "" {
		t.Errorf("mode 0600: %q", w)
	}
	if w := ExposedPasswords(ts[1:2], 0o644, "targets.txt"); w != "" {
		t.Errorf("no password: %q", w)
	}
}

func TestParseTargetsRefuses(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a postgres://u:S3cret-pw@h/d\na postgres://u:S3cret-pw@h/e", "line 2: target name \"a\" is already used on line 1"},
		{"# c\n\nprod postgres://u:S3cret-pw@h:99999/d", "line 3:"},
		{"prod", "line 1: not a connection string"},
		{"pr|od postgres://u:S3cret-pw@h/d", "line 1: target name is not usable"},
		{"postgres://u:S3cret-pw@[::1/d", "line 1:"},
		{"# only comments\n", "no targets"},
	} {
		_, err := ParseTargets(strings.NewReader(c.in), "targets.txt")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("%q: %v, want an error with %q and no password", c.in, err, c.want)
		}
	}
}

func TestShardsStable(t *testing.T) {
	var ts []Target
	for i := 0; i < 100; i++ {
		ts = append(ts, Target{Name: "tenant-" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
	}
	seen := map[string]int{}
	for i := 1; i <= 3; i++ {
		part := (Shard{I: i, N: 3}).Select(ts)
		if len(part) < 15 {
			t.Errorf("shard %d/3 has %d of 100 targets", i, len(part))
		}
		for _, x := range part {
			seen[x.Name]++
			// The same name lands in the same shard whatever else the file holds.
			if got := (Shard{I: i, N: 3}).Select([]Target{x}); len(got) != 1 {
				t.Errorf("%s: shard depends on the other targets", x.Name)
			}
		}
	}
	if len(seen) != 100 {
		t.Errorf("%d of 100 targets in some shard", len(seen))
	}
	for n, c := range seen {
		if c != 1 {
			t.Errorf("%s in %d shards", n, c)
		}
	}
	for _, bad := range []string{"0/2", "3/2", "1", "a/b", "1/0"} {
		if _, err := ParseShard(bad); err == nil {
			t.Errorf("--shard %s accepted", bad)
		}
	}
}

func TestWorst(t *testing.T) {
	for _, c := range []struct{ a, b, want int }{{0, 4, 4}, {4, 1, 1}, {1, 3, 3}, {3, 2, 2}, {2, 130, 130}, {0, 0, 0}} {
		if got := Worst(c.a, c.b); got != c.want {
			t.Errorf("Worst(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := Worst(c.b, c.a); got != c.want {
			t.Errorf("Worst(%d, %d) = %d, want %d", c.b, c.a, got, c.want)
		}
	}
}
