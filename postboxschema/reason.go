package postboxschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/postbox-go/postbox/internal/printable"
)

// Limits on the numbers of a payload checked against a schema. The
// validator compares numbers exactly (math/big): a million-digit number
// costs it seconds per keyword, and an exponent in the millions makes it
// fail outright.
const (
	MaxNumberChars    = 256
	MaxNumberExponent = 1000
)

// parseJSON decodes one JSON document, numbers kept exact (json.Number),
// as the validator wants them.
func parseJSON(b []byte) (any, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("empty input")
	}
	if !utf8.Valid(b) {
		i := 0
		for i < len(b) {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return nil, fmt.Errorf("not valid UTF-8 (%s)", position(b, i))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			return nil, fmt.Errorf("%s (%s)", se.Error(), position(b, int(se.Offset)-1))
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, errors.New("unexpected end of input")
		}
		return nil, err
	}
	end := int(dec.InputOffset())
	if rest := bytes.TrimLeft(b[end:], " \t\r\n"); len(rest) > 0 {
		return nil, fmt.Errorf("more data after the JSON value (%s)", position(b, len(b)-len(rest)))
	}
	return v, nil
}

// position names byte offset i of b as a line and column, both from 1.
func position(b []byte, i int) string {
	i = max(0, min(i, len(b)))
	line := 1 + bytes.Count(b[:i], []byte{'\n'})
	col := 1 + utf8.RuneCount(b[bytes.LastIndexByte(b[:i], '\n')+1:i])
	return fmt.Sprintf("line %d, column %d", line, col)
}

// checkNumbers finds the first number of v (in document order for arrays,
// key order for objects) beyond MaxNumberChars or MaxNumberExponent.
func checkNumbers(v any, loc []string) *violation {
	switch v := v.(type) {
	case json.Number:
		if !numberInRange(string(v)) {
			return &violation{loc: pointer(loc), msg: fmt.Sprintf("number is beyond what can be checked (at most %d characters and an exponent within ±%d)", MaxNumberChars, MaxNumberExponent)}
		}
	case []any:
		for i, e := range v {
			if bad := checkNumbers(e, append(loc, strconv.Itoa(i))); bad != nil {
				return bad
			}
		}
	case map[string]any:
		// Sorted, so that the same payload is always reported the same way.
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if bad := checkNumbers(v[k], append(loc, k)); bad != nil {
				return bad
			}
		}
	}
	return nil
}

func numberInRange(n string) bool {
	if len(n) > MaxNumberChars {
		return false
	}
	i := strings.IndexAny(n, "eE")
	if i < 0 {
		return true
	}
	exp, err := strconv.Atoi(n[i+1:])
	return err == nil && exp >= -MaxNumberExponent && exp <= MaxNumberExponent
}

// violation is one failed keyword at one location.
type violation struct {
	loc string // JSON pointer into the instance
	msg string
	kw  string // keyword, when msg does not say it
}

func (v violation) String() string {
	s := "at " + displayLoc(v.loc) + ": " + v.msg
	if v.kw != "" {
		s += " (" + v.kw + ")"
	}
	return clip(s, 240)
}

// render joins the first limit violations, and counts the rest.
func render(vs []violation, limit int) string {
	if len(vs) == 0 {
		return "does not match its schema"
	}
	n := min(len(vs), limit)
	parts := make([]string, n, n+1)
	for i, v := range vs[:n] {
		parts[i] = v.String()
	}
	if more := len(vs) - n; more == 1 {
		parts = append(parts, "and 1 more violation")
	} else if more > 1 {
		parts = append(parts, fmt.Sprintf("and %d more violations", more))
	}
	return strings.Join(parts, "; ")
}

// summarize flattens the validator's error tree into its violations,
// sorted by location and message, without repeats.
func summarize(e *jsonschema.ValidationError) []violation {
	var vs []violation
	collect(e, &vs)
	slices.SortFunc(vs, func(a, b violation) int {
		if c := strings.Compare(a.loc, b.loc); c != 0 {
			return c
		}
		if c := strings.Compare(a.msg, b.msg); c != 0 {
			return c
		}
		return strings.Compare(a.kw, b.kw)
	})
	return slices.Compact(vs)
}

func collect(e *jsonschema.ValidationError, out *[]violation) {
	loc := pointer(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.AnyOf:
		*out = append(*out, violation{loc: loc, msg: "must match at least one schema of anyOf" + alternatives(e)})
		return
	case *kind.OneOf:
		if len(k.Subschemas) == 0 {
			*out = append(*out, violation{loc: loc, msg: "must match exactly one schema of oneOf, matches none" + alternatives(e)})
			return
		}
	case *kind.PropertyNames:
		msg := "property name " + quote(k.Property) + " is invalid"
		var inner []violation
		for _, c := range e.Causes {
			collect(c, &inner)
		}
		if len(inner) > 0 {
			msg += ": " + inner[0].msg
		}
		*out = append(*out, violation{loc: loc, msg: msg, kw: "propertyNames"})
		return
	case *kind.Contains, *kind.MinContains, *kind.ContentSchema:
		// Their causes are every item or decoded value that failed; the
		// keyword's own message says more.
		*out = append(*out, leaf(e))
		return
	}
	if len(e.Causes) == 0 {
		*out = append(*out, leaf(e))
		return
	}
	for _, c := range e.Causes {
		collect(c, out)
	}
}

// alternatives lists the first failure of each alternative of an anyOf or
// oneOf, at most three of them.
func alternatives(e *jsonschema.ValidationError) string {
	loc := pointer(e.InstanceLocation)
	var alts []string
	for i, c := range e.Causes {
		if i == 3 {
			alts = append(alts, "...")
			break
		}
		vs := summarize(c)
		if len(vs) == 0 {
			continue
		}
		s := vs[0].msg
		if vs[0].loc != loc {
			s = "at " + displayLoc(vs[0].loc) + ": " + s
		}
		alts = append(alts, clip(s, 80))
	}
	if len(alts) == 0 {
		return ""
	}
	return " (" + strings.Join(alts, " | ") + ")"
}

func leaf(e *jsonschema.ValidationError) violation {
	v := violation{loc: pointer(e.InstanceLocation)}
	if p := e.ErrorKind.KeywordPath(); len(p) > 0 {
		v.kw = p[0]
	}
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		v.msg = "must be " + strings.Join(k.Want, " or ") + ", not " + k.Got
	case *kind.Const:
		v.msg = "must be " + display(k.Want)
	case *kind.Enum:
		v.msg = "must be one of " + list(k.Want, 5)
	case *kind.Format:
		v.msg = "is not a valid " + k.Want
		if k.Err != nil {
			v.msg += ": " + clip(visible(k.Err.Error()), 80)
		}
	case *kind.Required:
		v.msg = plural(len(k.Missing), "missing property ", "missing properties ") + quoteAll(k.Missing)
	case *kind.Dependency:
		v.msg = plural(len(k.Missing), "needs property ", "needs properties ") + quoteAll(k.Missing) + " when " + quote(k.Prop) + " is present"
		v.kw = "dependencies"
	case *kind.DependentRequired:
		v.msg = plural(len(k.Missing), "needs property ", "needs properties ") + quoteAll(k.Missing) + " when " + quote(k.Prop) + " is present"
	case *kind.AdditionalProperties:
		props := slices.Sorted(slices.Values(k.Properties))
		v.msg = plural(len(props), "property ", "properties ") + quoteAll(props) + plural(len(props), " is not allowed", " are not allowed")
	case *kind.MinProperties:
		v.msg = fmt.Sprintf("must have at least %s, has %d", count(k.Want, "property", "properties"), k.Got)
	case *kind.MaxProperties:
		v.msg = fmt.Sprintf("must have at most %s, has %d", count(k.Want, "property", "properties"), k.Got)
	case *kind.MinItems:
		v.msg = fmt.Sprintf("must have at least %s, has %d", count(k.Want, "item", "items"), k.Got)
	case *kind.MaxItems:
		v.msg = fmt.Sprintf("must have at most %s, has %d", count(k.Want, "item", "items"), k.Got)
	case *kind.AdditionalItems:
		v.msg = fmt.Sprintf("has %s more than allowed", count(k.Count, "item", "items"))
	case *kind.UniqueItems:
		v.msg = fmt.Sprintf("items %d and %d are equal", k.Duplicates[0], k.Duplicates[1])
	case *kind.Contains:
		v.msg = "has no item that matches contains"
	case *kind.MinContains:
		v.msg = fmt.Sprintf("must have at least %s that match contains, has %d", count(k.Want, "item", "items"), len(k.Got))
	case *kind.MaxContains:
		v.msg = fmt.Sprintf("must have at most %s that match contains, has %d", count(k.Want, "item", "items"), len(k.Got))
	case *kind.MinLength:
		v.msg = fmt.Sprintf("must be at least %s long, is %d", count(k.Want, "character", "characters"), k.Got)
	case *kind.MaxLength:
		v.msg = fmt.Sprintf("must be at most %s long, is %d", count(k.Want, "character", "characters"), k.Got)
	case *kind.Pattern:
		v.msg = "must match the pattern " + quote(k.Want)
	case *kind.ContentEncoding:
		v.msg = "is not " + k.Want + " encoded"
	case *kind.ContentMediaType:
		v.msg = "is not " + k.Want
	case *kind.ContentSchema:
		v.msg = "content does not match contentSchema"
	case *kind.Minimum:
		v.msg = "must be >= " + number(k.Want)
	case *kind.Maximum:
		v.msg = "must be <= " + number(k.Want)
	case *kind.ExclusiveMinimum:
		v.msg = "must be > " + number(k.Want)
	case *kind.ExclusiveMaximum:
		v.msg = "must be < " + number(k.Want)
	case *kind.MultipleOf:
		v.msg = "must be a multiple of " + number(k.Want)
	case *kind.Not:
		v.msg = "must not match the schema of not"
	case *kind.OneOf:
		v.msg = fmt.Sprintf("must match exactly one schema of oneOf, matches %s", joinInts(k.Subschemas))
	case *kind.FalseSchema:
		v.msg, v.kw = "is not allowed here", "false schema"
	default:
		// A kind this package does not know: the library's own words.
		s := (&jsonschema.ValidationError{ErrorKind: e.ErrorKind}).Error()
		v.msg = stripBase(strings.TrimPrefix(s, "at '': "))
	}
	return v
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func count(n int, one, many string) string { return strconv.Itoa(n) + " " + plural(n, one, many) }

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	if len(parts) == 2 {
		return parts[0] + " and " + parts[1]
	}
	return strings.Join(parts, ", ")
}

// pointer renders an instance location as a JSON pointer (RFC 6901).
func pointer(tokens []string) string {
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return sb.String()
}

func displayLoc(p string) string {
	if p == "" {
		return "(root)"
	}
	return clip(visible(p), 100)
}

func quote(s string) string { return strconv.Quote(clip(s, 40)) }

func quoteAll(ss []string) string {
	parts := make([]string, 0, min(len(ss), 5)+1)
	for i, s := range ss {
		if i == 5 {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, quote(s))
	}
	return strings.Join(parts, ", ")
}

func display(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return clip(visible(string(b)), 40)
}

func list(vs []any, n int) string {
	parts := make([]string, 0, min(len(vs), n)+1)
	for i, v := range vs {
		if i == n {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, display(v))
	}
	return strings.Join(parts, ", ")
}

func number(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() && len(r.Num().String()) <= 21 {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// visible escapes what would break a one-line reason.
func visible(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	var sb strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) {
			sb.WriteRune(r)
		} else {
			fmt.Fprintf(&sb, "\\u%04x", r)
		}
	}
	return sb.String()
}

// clip shortens s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string { return printable.Shorten(s, n) }
