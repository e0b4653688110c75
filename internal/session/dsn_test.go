package session

import (
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestResolveOrder(t *testing.T) {
	all := map[string]string{"PGFLOW_UPGRADE_DSN": "tool", "DATABASE_URL": "dburl", "PGHOST": "h"}
	cases := []struct {
		name string
		flag string
		env  map[string]string
		want Resolved
	}{
		{"flag wins", "flag", all, Resolved{"flag", SourceFlag}},
		{"tool env next", "", all, Resolved{"tool", SourceToolEnv}},
		{"DATABASE_URL next", "", map[string]string{"DATABASE_URL": "dburl", "PGHOST": "h"}, Resolved{"dburl", SourceDatabaseURL}},
		{"libpq env", "", map[string]string{"PGUSER": "u"}, Resolved{"", SourceLibpqEnv}},
		{"nothing", "", map[string]string{}, Resolved{"", SourceNone}},
	}
	for _, c := range cases {
		if got := Resolve(c.flag, env(c.env)); got != c.want {
			t.Errorf("%s: got %+v want %+v", c.name, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	cases := []string{
		"postgres://alice:s3cr3t@db.example:5432/app",
		"postgresql://alice:s3cr3t@db.example/app?sslmode=disable",
		"postgres://alice@db.example/app?password=s3cr3t",
		"host=db user=alice password=s3cr3t dbname=app",
		"host=db user=alice password='s3cr3t' dbname=app",
		"postgres://alice:s3cr3t@[bad",
	}
	for _, c := range cases {
		got := Redact(c)
		if strings.Contains(got, "s3cr3t") {
			t.Errorf("Redact(%q) = %q still holds the password", c, got)
		}
		if !strings.Contains(got, "alice") {
			t.Errorf("Redact(%q) = %q lost the user name", c, got)
		}
	}
}

func TestParseConfigErrorHasNoPassword(t *testing.T) {
	_, err := ParseConfig("postgres://alice:s3cr3t@host:notaport/db")
	if err == nil {
		t.Fatal("expected a parse error for a non-numeric port")
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestRedactTextRemovesEncodedPassword(t *testing.T) {
	d := "postgres://alice:p%40ss@host/db"
	msg := "failed to connect to alice:p@ss and p%40ss"
	got := RedactText(msg, d)
	if strings.Contains(got, "p@ss") || strings.Contains(got, "p%40ss") {
		t.Fatalf("RedactText left the password: %q", got)
	}
}
