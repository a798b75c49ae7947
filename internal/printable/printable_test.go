package printable

import "testing"

func TestLineTextAndVisibleASCII(t *testing.T) {
	for _, c := range []struct {
		s                 string
		line, text, ascii bool
	}{
		{"", true, true, false},
		{"orders.créé", true, true, false},
		{"spaces are ok", true, true, false},
		{"abc-123_~", true, true, true},
		{"tab\there", false, true, false},
		{"new\nline", false, false, false},
		{"del\x7f", false, false, false},
		{"bad\xffutf8", false, false, false},
	} {
		if got := Line(c.s); got != c.line {
			t.Errorf("Line(%q) = %t, want %t", c.s, got, c.line)
		}
		if got := Text(c.s); got != c.text {
			t.Errorf("Text(%q) = %t, want %t", c.s, got, c.text)
		}
		if got := VisibleASCII(c.s); got != c.ascii {
			t.Errorf("VisibleASCII(%q) = %t, want %t", c.s, got, c.ascii)
		}
	}
}

func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"  plain  ":                  "plain",
		"two\r\nlines\tand\x00nul":   "two lines and nul",
		"bad \xff byte":              "bad ? byte",
		"{\"error\":\n  \"nope\"}\n": "{\"error\": \"nope\"}",
	} {
		if got := OneLine([]byte(in)); got != want {
			t.Errorf("OneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCutAndShorten(t *testing.T) {
	s := "abc" + "é" + "def" // é is 2 bytes, at 3 and 4
	for n, want := range map[int]string{0: "", 3: "abc", 4: "abc", 5: "abcé", 100: s} {
		if got := Cut(s, n); got != want {
			t.Errorf("Cut(%q, %d) = %q, want %q", s, n, got, want)
		}
	}
	if got := Shorten(s, 7); got != "abc..." {
		t.Errorf("Shorten(%q, 7) = %q, want abc...", s, got)
	}
	if got := Shorten(s, 8); got != s {
		t.Errorf("Shorten(%q, 8) = %q, want it whole", s, got)
	}
}
