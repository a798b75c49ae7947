package postboxschema

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/postbox-go/postbox"
)

// SchemaSuffix ends the file name of a topic's schema: <topic>.schema.json.
const SchemaSuffix = ".schema.json"

// DefaultMaxViolations is how many violations a rejection lists by default.
const DefaultMaxViolations = 3

// Options configures a Registry. A nil *Options means the defaults.
type Options struct {
	// RequireSchema rejects payloads of topics that have no schema, with a
	// *postbox.ValidationError on the field "topic". By default they pass
	// unchecked.
	RequireSchema bool

	// DefaultDraft is the draft of schemas that do not name one with
	// "$schema". Default jsonschema.Draft2020 (2020-12), fixed here rather
	// than left to the library, whose default moves with its releases.
	DefaultDraft *jsonschema.Draft

	// AssertFormat makes "format" an assertion ("email", "date-time",
	// "uuid", ...) in every draft. By default it is one only where the draft
	// says so (draft-07 and older).
	AssertFormat bool

	// AssertContent checks contentEncoding, contentMediaType and
	// contentSchema, which are annotations by default.
	AssertContent bool

	// MaxViolations is how many violations the reason of a rejection lists;
	// the rest are counted. Default DefaultMaxViolations.
	MaxViolations int
}

type options struct {
	require       bool
	draft         *jsonschema.Draft
	assertFormat  bool
	assertContent bool
	maxViolations int
}

func (o *Options) resolve() (*options, error) {
	out := &options{draft: jsonschema.Draft2020, maxViolations: DefaultMaxViolations}
	if o == nil {
		return out, nil
	}
	if o.MaxViolations < 0 {
		return nil, &postbox.ValidationError{Field: "MaxViolations", Value: fmt.Sprint(o.MaxViolations), Reason: "must not be negative"}
	}
	out.require = o.RequireSchema
	out.assertFormat = o.AssertFormat
	out.assertContent = o.AssertContent
	if o.DefaultDraft != nil {
		out.draft = o.DefaultDraft
	}
	if o.MaxViolations > 0 {
		out.maxViolations = o.MaxViolations
	}
	return out, nil
}

// Registry holds the compiled schema of each topic. It implements
// postbox.PayloadValidator; set it as postbox.Config.Validator.
type Registry struct {
	schemas       map[string]*jsonschema.Schema
	require       bool
	maxViolations int
}

var _ postbox.PayloadValidator = (*Registry)(nil)

// SchemaError is one schema that could not be loaded.
type SchemaError struct {
	// Name is the file (Load: joined with the directory; LoadFS: as named
	// in the fs.FS), or the topic for New.
	Name string
	// Reason says what is wrong, on one line.
	Reason string
}

func (e *SchemaError) Error() string { return e.Name + ": " + e.Reason }

// LoadError lists every schema that could not be loaded, in name order.
// No Registry is made when one is returned.
type LoadError struct {
	Problems []*SchemaError
}

func (e *LoadError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Error()
	}
	n := fmt.Sprintf("%d problems", len(parts))
	if len(parts) == 1 {
		n = "1 problem"
	}
	return fmt.Sprintf("postboxschema: cannot load schemas (%s): %s", n, strings.Join(parts, "; "))
}

// Unwrap exposes each problem to errors.As.
func (e *LoadError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p
	}
	return out
}

// Load reads the schemas of dir: <topic>.schema.json for each topic, and
// other .json files as shared documents for "$ref" (see the package
// documentation). Every bad file is listed at once in a *LoadError. A
// directory without any topic schema is an error too, as it most likely
// names the wrong directory.
func Load(dir string, opts *Options) (*Registry, error) {
	return load(os.DirFS(dir), dir, func(name string) string { return filepath.Join(dir, name) }, opts)
}

// LoadFS is Load on the root directory of fsys, e.g. an embed.FS (use
// fs.Sub for a subdirectory). Problems name files as fsys does.
func LoadFS(fsys fs.FS, opts *Options) (*Registry, error) {
	return load(fsys, "the file system", func(name string) string { return name }, opts)
}

// New compiles schemas held in memory, keyed by topic. They can refer to
// one another with "$ref": "<topic>.schema.json". Every bad schema is listed
// at once in a *LoadError, named by its topic.
func New(schemas map[string][]byte, opts *Options) (*Registry, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	var docs []document
	var problems []*SchemaError
	for _, topic := range slices.Sorted(maps.Keys(schemas)) {
		if err := postbox.ValidateTopic(topic); err != nil {
			problems = append(problems, &SchemaError{Name: fmt.Sprintf("%q", clip(topic, 64)), Reason: "is not a valid topic: " + reasonOf(err)})
			continue
		}
		docs = append(docs, document{name: topic, file: topic + SchemaSuffix, topic: topic, data: schemas[topic]})
	}
	return build(docs, problems, o)
}

func load(fsys fs.FS, where string, display func(string) string, opts *Options) (*Registry, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("postboxschema: read schema directory %s: %w", where, err)
	}
	var docs []document
	var problems []*SchemaError
	topics := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue
		}
		d := document{name: display(name), file: name}
		if stem, ok := strings.CutSuffix(name, SchemaSuffix); ok {
			if err := postbox.ValidateTopic(stem); err != nil {
				problems = append(problems, &SchemaError{Name: d.name, Reason: "does not name a valid topic (<topic>" + SchemaSuffix + "): " + reasonOf(err)})
				continue
			}
			d.topic = stem
			topics++
		} else if err := postbox.ValidateTopic(strings.TrimSuffix(name, ".json")); err != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: "shared schema files are named with letters, digits and . _ : - only"})
			continue
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: "cannot be read: " + err.Error()})
			continue
		}
		d.data = data
		docs = append(docs, d)
	}
	if topics == 0 && len(problems) == 0 {
		return nil, fmt.Errorf("postboxschema: no topic schemas (<topic>%s) in %s", SchemaSuffix, where)
	}
	return build(docs, problems, o)
}

// document is one schema source: a topic schema when topic is set, else a
// shared document.
type document struct {
	name  string // for problems
	file  string // the name a "$ref" uses
	topic string
	data  []byte
}

// baseURL roots every document, so a "$ref" between files resolves as it
// would on disk, while no URL can reach a real file or the network.
const baseURL = "postbox-schema:///"

func build(docs []document, problems []*SchemaError, o *options) (*Registry, error) {
	ld := &loader{files: map[string][]byte{}, used: map[string]bool{}}
	var ok []document
	for _, d := range docs {
		doc, err := parseJSON(d.data)
		if err != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: "is not JSON: " + err.Error()})
			continue
		}
		// The library drops a keyword whose number it cannot hold, which
		// would silently weaken the schema.
		if v := checkNumbers(doc, nil); v != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: v.String()})
			continue
		}
		ld.files[baseURL+d.file] = d.data
		ok = append(ok, d)
	}
	reg := &Registry{schemas: map[string]*jsonschema.Schema{}, require: o.require, maxViolations: o.maxViolations}
	// Topic schemas first, noting which shared documents they reach.
	ld.track = true
	for _, d := range ok {
		if d.topic == "" {
			continue
		}
		sch, err := compile(o, ld, d.file)
		if err != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: err.Error()})
			continue
		}
		reg.schemas[d.topic] = sch
	}
	ld.track = false
	for _, d := range ok {
		if d.topic != "" {
			continue
		}
		if _, err := compile(o, ld, d.file); err != nil {
			problems = append(problems, &SchemaError{Name: d.name, Reason: err.Error()})
		} else if !ld.used[baseURL+d.file] {
			problems = append(problems, &SchemaError{Name: d.name, Reason: "no topic schema refers to it; a topic's schema is named <topic>" + SchemaSuffix})
		}
	}
	if len(problems) > 0 {
		slices.SortStableFunc(problems, func(a, b *SchemaError) int { return strings.Compare(a.Name, b.Name) })
		return nil, &LoadError{Problems: problems}
	}
	return reg, nil
}

// compile compiles one document with a compiler of its own, so that one
// broken schema cannot leave state behind that affects another.
func compile(o *options, ld *loader, file string) (sch *jsonschema.Schema, err error) {
	defer func() {
		if r := recover(); r != nil {
			sch, err = nil, fmt.Errorf("cannot be compiled: %v", r)
		}
	}()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(o.draft)
	c.UseLoader(ld)
	if o.assertFormat {
		c.AssertFormat()
	}
	if o.assertContent {
		c.AssertContent()
	}
	sch, err = c.Compile(baseURL + file)
	if err != nil {
		return nil, errors.New(describeCompileError(err, file))
	}
	return sch, nil
}

// loader serves the documents of one Registry, and nothing else.
type loader struct {
	files map[string][]byte
	used  map[string]bool
	track bool
}

var errNotLoaded = errors.New("not a file of the schema set; only its .json files can be referenced")

func (l *loader) Load(url string) (any, error) {
	data, ok := l.files[url]
	if !ok {
		return nil, errNotLoaded
	}
	if l.track {
		l.used[url] = true
	}
	// Parsed afresh for each compiler, which may keep what it is given.
	return parseJSON(data)
}

func describeCompileError(err error, file string) string {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) {
		who := "is not a valid schema"
		if target := strings.TrimSuffix(stripBase(sve.URL), "#"); target != file {
			who = "refers to " + target + ", which is not a valid schema"
		}
		var ve *jsonschema.ValidationError
		if errors.As(sve.Err, &ve) {
			vs := summarize(ve)
			return who + ": " + render(vs, DefaultMaxViolations)
		}
		return who + ": " + oneLine(stripBase(sve.Err.Error()))
	}
	var lue *jsonschema.LoadURLError
	if errors.As(err, &lue) {
		return fmt.Sprintf("cannot load %q: %s", stripBase(lue.URL), oneLine(lue.Err.Error()))
	}
	return oneLine(stripBase(err.Error()))
}

func stripBase(s string) string { return strings.ReplaceAll(s, baseURL, "") }

func oneLine(s string) string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(lines[i]), "- "))
	}
	return clip(strings.Join(slices.DeleteFunc(lines, func(l string) bool { return l == "" }), "; "), 300)
}

func reasonOf(err error) string {
	var ve *postbox.ValidationError
	if errors.As(err, &ve) {
		return ve.Reason
	}
	return err.Error()
}

// Topics returns the topics that have a schema, sorted.
func (r *Registry) Topics() []string {
	if r == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(r.schemas))
}

// ValidatePayload implements postbox.PayloadValidator. It returns nil when
// payload satisfies topic's schema, or when topic has none and the Registry
// does not require one; otherwise a *postbox.ValidationError on the field
// "payload" (or "topic", for a missing schema).
func (r *Registry) ValidatePayload(topic string, payload []byte) error {
	if r == nil {
		return nil
	}
	sch, ok := r.schemas[topic]
	if !ok {
		if r.require {
			return &postbox.ValidationError{Field: "topic", Value: clip(topic, 64), Reason: "has no schema, and schemas are required"}
		}
		return nil
	}
	inst, err := parseJSON(payload)
	if err != nil {
		return &postbox.ValidationError{Field: "payload", Reason: "is not JSON: " + err.Error()}
	}
	if v := checkNumbers(inst, nil); v != nil {
		return &postbox.ValidationError{Field: "payload", Reason: render([]violation{*v}, 1)}
	}
	if err := validate(sch, inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return &postbox.ValidationError{Field: "payload", Reason: render(summarize(ve), r.maxViolations)}
		}
		return &postbox.ValidationError{Field: "payload", Reason: oneLine(stripBase(err.Error()))}
	}
	return nil
}

// validate runs the validator, turning a panic inside it into an error: a
// payload must never bring down the writer's process.
func validate(sch *jsonschema.Schema, inst any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot be checked against its schema: %v", r)
		}
	}()
	return sch.Validate(inst)
}
