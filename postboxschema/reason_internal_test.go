package postboxschema

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 10, "abcdefg..."},
		{"ééééé", 8, "éé..."}, // never cuts a rune in two
	} {
		got := clip(tc.in, tc.n)
		if got != tc.want || len(got) > tc.n || !utf8.ValidString(got) {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestPointerAndDisplay(t *testing.T) {
	if got := pointer([]string{"a/b", "m~n", "0", ""}); got != "/a~1b/m~0n/0/" {
		t.Errorf("pointer = %q", got)
	}
	if got := displayLoc(""); got != "(root)" {
		t.Errorf("root = %q", got)
	}
	if got := displayLoc("/a\nb\x00"); got != `/a\u000ab\u0000` {
		t.Errorf("control characters = %q", got)
	}
	if got := displayLoc("/" + strings.Repeat("k", 300)); len(got) > 100 {
		t.Errorf("long location kept %d bytes", len(got))
	}
}

func TestNumberInRange(t *testing.T) {
	for n, want := range map[string]bool{
		"0": true, "-1.5": true, "1e1000": true, "1E-1000": true, "2e+999": true,
		"1e1001": false, "1e-1001": false, "1e99999999999999999999": false,
		strings.Repeat("1", MaxNumberChars): true, strings.Repeat("1", MaxNumberChars+1): false,
	} {
		if got := numberInRange(n); got != want {
			t.Errorf("numberInRange(%.20s) = %v, want %v", n, got, want)
		}
	}
}

func TestPosition(t *testing.T) {
	b := []byte("ab\ncdé\nf")
	for i, want := range map[int]string{0: "line 1, column 1", 3: "line 2, column 1", 7: "line 2, column 4", 8: "line 3, column 1", 99: "line 3, column 2"} {
		if got := position(b, i); got != want {
			t.Errorf("position(%d) = %s, want %s", i, got, want)
		}
	}
}
