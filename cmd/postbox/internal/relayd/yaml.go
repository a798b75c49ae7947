package relayd

import (
	"encoding"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// ErrBadYAML is returned (wrapped) for a configuration file the YAML
// decoder could not read, or whose keys and values do not fit the
// configuration. When the file is valid YAML, the error also wraps a
// *postbox.ConfigError listing every problem at once: unknown keys,
// values of the wrong type, environment references that are malformed or
// name an unset variable.
var ErrBadYAML = errors.New("not a valid configuration file")

// decodeYAML decodes b into cfg. A document that is not YAML fails as a
// whole; past that, every key is decoded on its own, so that every
// unknown key and every bad value is reported, each named by its path
// (relay.lease, routes[1].publisher). String values have their ${VAR}
// references expanded with getenv first.
func decodeYAML(b []byte, cfg *Config, getenv func(string) string) (problems []*postbox.ValidationError, err error) {
	// The decoder panics on some malformed input (a !!binary tag where a
	// list belongs, found by FuzzRelayConfig); that is bad input too.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: the YAML decoder failed on it (%v)", ErrBadYAML, p)
		}
	}()
	var raw any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadYAML, yaml.FormatError(err, false, true))
	}
	w := walker{getenv: getenv}
	w.value(reflect.ValueOf(cfg).Elem(), raw, "")
	return w.problems, nil
}

type walker struct {
	getenv   func(string) string
	problems []*postbox.ValidationError
}

func (w *walker) bad(path string, value any, format string, args ...any) {
	if path == "" {
		path = "(document)"
	}
	w.problems = append(w.problems, configcheck.Problem(path, value, format, args...))
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// value decodes raw (what yaml.Unmarshal made of a node: a map, a slice,
// a scalar or nil) into dst, the field at path.
func (w *walker) value(dst reflect.Value, raw any, path string) {
	if raw == nil {
		return // an empty value leaves the field at its default
	}
	if reflect.PointerTo(dst.Type()).Implements(textUnmarshaler) {
		s, ok := w.scalar(raw, path)
		if !ok {
			return
		}
		if err := dst.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
			w.bad(path, s, "%v", err)
		}
		return
	}
	switch dst.Kind() {
	case reflect.Struct:
		m, ok := raw.(map[string]any)
		if !ok {
			w.bad(path, "", "want a mapping of %s", keysOf(dst.Type()))
			return
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			f, ok := fieldByTag(dst, k)
			if !ok {
				w.bad(join(path, k), "", "unknown key; allowed here: %s", keysOf(dst.Type()))
				continue
			}
			w.value(f, m[k], join(path, k))
		}
	case reflect.Slice:
		items, ok := raw.([]any)
		if !ok {
			if dst.Type().Elem().Kind() == reflect.String {
				if _, scalar := raw.(string); scalar {
					w.bad(path, "", "want a list, e.g. [a, b]")
					return
				}
			}
			w.bad(path, "", "want a list")
			return
		}
		out := reflect.MakeSlice(dst.Type(), len(items), len(items))
		for i, it := range items {
			w.value(out.Index(i), it, fmt.Sprintf("%s[%d]", path, i))
		}
		dst.Set(out)
	case reflect.Map:
		m, ok := raw.(map[string]any)
		if !ok {
			w.bad(path, "", "want a mapping of names to strings")
			return
		}
		out := reflect.MakeMapWithSize(dst.Type(), len(m))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			v := reflect.New(dst.Type().Elem()).Elem()
			w.value(v, m[k], join(path, k))
			out.SetMapIndex(reflect.ValueOf(k), v)
		}
		dst.Set(out)
	case reflect.String:
		if s, ok := w.scalar(raw, path); ok {
			dst.SetString(s)
		}
	case reflect.Bool:
		b, ok := raw.(bool)
		if !ok {
			w.bad(path, fmt.Sprint(raw), "want true or false")
			return
		}
		dst.SetBool(b)
	case reflect.Int, reflect.Int64:
		var n int64
		switch v := raw.(type) {
		case int64:
			n = v
		case uint64:
			if v > 1<<62 {
				w.bad(path, fmt.Sprint(raw), "is too large")
				return
			}
			n = int64(v)
		case int:
			n = int64(v)
		default:
			w.bad(path, fmt.Sprint(raw), "want a whole number")
			return
		}
		if dst.OverflowInt(n) {
			w.bad(path, fmt.Sprint(raw), "is too large")
			return
		}
		dst.SetInt(n)
	default:
		w.bad(path, "", "cannot be set from the file")
	}
}

// scalar returns raw as a string with its environment references
// expanded: a string as it is, a number or boolean as YAML wrote it.
func (w *walker) scalar(raw any, path string) (string, bool) {
	var s string
	switch v := raw.(type) {
	case string:
		s = v
	case bool, int, int64, uint64, float64:
		s = fmt.Sprint(v)
	default:
		w.bad(path, "", "want a single value, not a list or mapping")
		return "", false
	}
	out, err := expandEnv(s, w.getenv)
	if err != nil {
		w.bad(path, "", "%v", err)
		return "", false
	}
	return out, true
}

var envRef = regexp.MustCompile(`\$\$|\$\{[^}]*\}?`)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expandEnv replaces each ${NAME} in s with the variable's value; $$ is a
// literal $, and a $ before anything else stays as it is. A reference to
// an unset variable, an unclosed one and one that is not a variable's name
// are errors: the value would otherwise be taken literally, and a secret
// written as "${TOKEN}" would be the text ${TOKEN}.
func expandEnv(s string, getenv func(string) string) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var err error
	out := envRef.ReplaceAllStringFunc(s, func(ref string) string {
		if err != nil {
			return ""
		}
		if ref == "$$" {
			return "$"
		}
		name, closed := strings.CutSuffix(strings.TrimPrefix(ref, "${"), "}")
		switch {
		case !closed:
			err = fmt.Errorf("%q is not closed: write ${NAME}, or $$ for a literal $", configcheck.ShortenTo(ref, 40))
		case !envName.MatchString(name):
			err = fmt.Errorf("%q does not name an environment variable: write ${NAME} (letters, digits, _), or $$ for a literal $",
				configcheck.ShortenTo(ref, 40))
		default:
			v, ok := lookup(getenv, name)
			if !ok {
				err = fmt.Errorf("refers to ${%s}, which is not set in the environment", name)
			}
			return v
		}
		return ""
	})
	return out, err
}

// lookup reads a variable; getenv says "" for an unset one, so an empty
// variable counts as unset.
func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func fieldByTag(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func keysOf(t reflect.Type) string {
	var ks []string
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" {
			ks = append(ks, tag)
		}
	}
	return strings.Join(ks, ", ")
}
