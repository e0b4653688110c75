package pgmqver

import "testing"

func TestVersionRules(t *testing.T) {
	for _, c := range []struct {
		v               string
		members, breaks bool
		crossesTo113    bool
	}{
		{"1.5.1", true, false, true},
		{"1.5.2", true, false, true},
		{"1.6.0", false, false, true},
		{"1.9.0", false, false, true},
		{"1.10.0", false, true, false},
		{"1.10.1", false, true, false},
		{"1.11.0", false, false, false},
		{"1.13.1", false, false, false},
	} {
		v := MustParse(c.v)
		if MembersLayout(v) != c.members || BreaksClaim(v) != c.breaks || CrossesLastReadAt(v, MustParse("1.13.1")) != c.crossesTo113 {
			t.Errorf("%s: members %v, breaks claim %v, crosses 1.10.0 %v", c.v, MembersLayout(v), BreaksClaim(v), CrossesLastReadAt(v, MustParse("1.13.1")))
		}
	}
	if !MustParse("1.9.0").Less(MustParse("1.10.0")) || MustParse("1.10.0").Less(MustParse("1.9.9")) {
		t.Error("versions must compare as numbers")
	}
	for _, bad := range []string{"", "1", "1.x", "1.2.3.4", "-1.2"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if v, err := Parse("1.7"); err != nil || v.String() != "1.7.0" {
		t.Errorf("Parse(1.7) = %v, %v", v, err)
	}
}
