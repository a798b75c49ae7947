package pubkit

import "testing"

func TestPrintable(t *testing.T) {
	for s, want := range map[string]bool{
		"":              true,
		"orders.créé":   true,
		"tab\there":     false,
		"new\nline":     false,
		"del\x7f":       false,
		"bad\xffutf8":   false,
		"spaces are ok": true,
	} {
		if got := Printable(s); got != want {
			t.Errorf("Printable(%q) = %t, want %t", s, got, want)
		}
	}
}

func TestVisibleASCII(t *testing.T) {
	for s, want := range map[string]bool{
		"":          false,
		"abc-123_~": true,
		"a b":       false,
		"é":         false,
		"a\x7f":     false,
	} {
		if got := VisibleASCII(s); got != want {
			t.Errorf("VisibleASCII(%q) = %t, want %t", s, got, want)
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
