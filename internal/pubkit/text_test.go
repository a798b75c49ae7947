package pubkit

import "testing"

func TestPrintableAndVisibleASCII(t *testing.T) {
	for _, c := range []struct {
		s                string
		printable, ascii bool
	}{
		{"", true, false},
		{"orders.créé", true, false},
		{"spaces are ok", true, false},
		{"abc-123_~", true, true},
		{"tab\there", false, false},
		{"new\nline", false, false},
		{"del\x7f", false, false},
		{"bad\xffutf8", false, false},
	} {
		if got := Printable(c.s); got != c.printable {
			t.Errorf("Printable(%q) = %t, want %t", c.s, got, c.printable)
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
