package relayd_test

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
)

func problems(t *testing.T, err error) []string {
	t.Helper()
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("want a *postbox.ConfigError, got %v", err)
	}
	var fs []string
	for _, p := range ce.Problems {
		fs = append(fs, p.Field)
	}
	return fs
}

// ${VAR} in a file's value is the variable's value; an unset one, an
// unclosed one and one that names no variable are errors naming the
// field, listed together; $$ is a literal $; POSTBOX_* values are taken
// literally.
func TestConfigExpandsEnvironment(t *testing.T) {
	vars := env(map[string]string{"OPS_TOKEN": "k3Vq9ZrT0pLw2XyA7bNc", "DB_HOST": "db.internal", "POSTBOX_READ_TOKEN": "${OPS_TOKEN}"})
	cfg, err := relayd.Parse([]byte(`
databases: [{url: "postgres://app@${DB_HOST}/app"}]
nats: {subject_prefix: "cost$$.${DB_HOST}."}
admin:
  tokens: [{name: ops, value: "${OPS_TOKEN}", scope: admin}]
`), vars)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Databases[0].URL != "postgres://app@db.internal/app" || cfg.Admin.Tokens[0].Value != "k3Vq9ZrT0pLw2XyA7bNc" || cfg.NATS.SubjectPrefix != "cost$.db.internal." {
		t.Fatalf("expanded: %+v", cfg)
	}
	if v := cfg.Admin.Tokens[1].Value; v != "${OPS_TOKEN}" {
		t.Fatalf("POSTBOX_READ_TOKEN expanded to %q: variables are taken literally", v)
	}
	if err := cfg.Validate(); err == nil || !slices.Contains(problems(t, err), "admin.tokens[1].value") {
		t.Fatalf("a token that is a reference was accepted: %v", err)
	}

	_, err = relayd.Parse([]byte(`
databases: [{url: "postgres://${NOT_SET}/app"}]
nats: {url: "${UNCLOSED"}
admin:
  tokens: [{name: ops, value: "${a long random secret}", scope: admin}]
`), vars)
	if !errors.Is(err, relayd.ErrBadYAML) {
		t.Fatalf("err = %v", err)
	}
	got := strings.Join(problems(t, err), " ")
	if want := "admin.tokens[0].value databases[0].url nats.url"; got != want {
		t.Fatalf("fields\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(err.Error(), "NOT_SET") || strings.Contains(err.Error(), "k3Vq9") {
		t.Fatalf("error should name the variable and show no secret: %v", err)
	}
}

// Secrets that look like an example's are refused, named by field and
// never shown.
func TestConfigRefusesPlaceholderSecrets(t *testing.T) {
	for _, v := range []string{"<a long random secret>", "changeme-changeme-changeme", "aaaaaaaaaaaaaaaaaaaaaaaa", "your-admin-token-goes-here",
		"xxxxxxxxxxxxxxxxxxxxxxxx", "a long random secret please"} {
		cfg, err := relayd.Parse([]byte("databases: [{url: \"postgres://h/db\"}]\nadmin: {tokens: [{name: ops, value: \""+v+"\", scope: admin}]}\n"), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.Validate()
		if err == nil || !slices.Contains(problems(t, err), "admin.tokens[0].value") || strings.Contains(err.Error(), v) {
			t.Errorf("token %q: %v", v, err)
		}
	}
	cfg, err := relayd.Parse([]byte("databases: [{url: \"postgres://h/db\"}]\nadmin: {tokens: [{name: ops, value: \"q8Zp0Lr2Tx4Vn6Bm1Kc3\", scope: admin}]}\n"), env(nil))
	if err != nil || cfg.Validate() != nil {
		t.Fatalf("a generated token was refused: %v", err)
	}
}

// Every problem of a file is listed at once: unknown keys at every
// level, values of the wrong type, bad durations.
func TestConfigYAMLListsEveryProblem(t *testing.T) {
	_, err := relayd.Parse([]byte(`
databases: [{url: "postgres://h/db", prefx: a_}]
nats: {url: 5, streems: []}
relay: {lease: soon, batch_size: many, block_on_dead: maybe}
routes: {topics: "a.*"}
amqp: [x]
bogus: 1
`), env(nil))
	if !errors.Is(err, relayd.ErrBadYAML) {
		t.Fatalf("err = %v", err)
	}
	got := strings.Join(problems(t, err), " ")
	want := "amqp bogus databases[0].prefx nats.streems relay.batch_size relay.block_on_dead relay.lease routes"
	if got != want {
		t.Fatalf("fields\n got %s\nwant %s\n%v", got, want, err)
	}
	if _, err := relayd.Parse([]byte("{{{{"), env(nil)); !errors.Is(err, relayd.ErrBadYAML) {
		t.Fatalf("not YAML: %v", err)
	}
	// A number where a string belongs is that string ("5" is a bad URL,
	// reported by Validate).
	cfg, err := relayd.Parse([]byte("databases: [{url: \"postgres://h/db\"}]\nnats: {url: 5}\n"), env(nil))
	if err != nil || cfg.NATS.URL != "5" {
		t.Fatalf("nats.url: 5 -> %+v %v", cfg, err)
	}
}

// A POSTBOX_* value that cannot be read is a problem named by the
// variable; every one is listed.
func TestConfigEnvironmentProblems(t *testing.T) {
	_, err := relayd.Parse(nil, env(map[string]string{"POSTBOX_LEASE": "soon", "POSTBOX_BATCH_SIZE": "many", "POSTBOX_ROUTES": "orders.*"}))
	if got := strings.Join(problems(t, err), " "); got != "POSTBOX_ROUTES POSTBOX_BATCH_SIZE POSTBOX_LEASE" {
		t.Fatalf("fields %s (%v)", got, err)
	}
	cfg, err := relayd.Parse(nil, env(map[string]string{
		"POSTBOX_DATABASE_URL": "postgres://h/db", "POSTBOX_ROUTES": "orders.*=nats, audit.*=amqp", "POSTBOX_AMQP_URL": "amqp://h",
		"POSTBOX_LEASE": "45s", "POSTBOX_RETENTION": "-1s", "POSTBOX_BLOCK_ON_DEAD": "true", "POSTBOX_READY_MAX_PENDING": "500",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Routes) != 2 || cfg.Routes[1].Publisher != "amqp" || !cfg.Relay.BlockOnDead || cfg.Ready.MaxPending != 500 || cfg.Relay.Retention >= 0 {
		t.Fatalf("config %+v", cfg)
	}
}

// Every setting of the file has a POSTBOX_* variable, or is listed among
// the settings only the file holds; every variable the help lists sets
// something, and every POSTBOX_ name in the package's and the command's
// source is listed.
func TestEveryVariableListed(t *testing.T) {
	covered := map[string]bool{}
	for _, e := range relayd.EnvVars {
		covered[e.Setting] = true
	}
	fileOnly := strings.Join(relayd.FileOnly, " ")
	var walk func(t reflect.Type, path string)
	walk = func(ty reflect.Type, path string) {
		for i := range ty.NumField() {
			f := ty.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			p := key
			if path != "" {
				p = path + "." + key
			}
			switch {
			case covered[p] || strings.Contains(fileOnly, p):
			case f.Type.Kind() == reflect.Struct && f.Type.Name() != "Duration":
				walk(f.Type, p)
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				walk(f.Type.Elem(), p+"[]")
			default:
				t.Errorf("setting %s has no POSTBOX_* variable and is not listed in FileOnly", p)
			}
		}
	}
	walk(reflect.TypeFor[relayd.Config](), "")

	help := relayd.EnvHelp()
	names := regexp.MustCompile(`POSTBOX_[A-Z_]+[A-Z]`)
	for _, file := range []string{"config.go", "env.go", "run.go", "../../relay.go"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names.FindAllString(string(b), -1) {
			if !strings.Contains(help, n+" ") {
				t.Errorf("%s names %s, which relay --help does not list", file, n)
			}
		}
	}
}

// Webhook destinations are routes like the brokers: webhook:NAME, checked
// by the adapter's own rules under the entry's name.
func TestConfigWebhookRoutes(t *testing.T) {
	cfg, err := relayd.Parse([]byte(`
databases: [{url: "postgres://h/db"}]
webhooks:
  - {name: partner, url: "ftp://x", secrets: ["whsec_short"], timeout: 1h}
  - {name: partner, url: "https://ok.example/hook", secrets: ["<secret>"]}
routes:
  - {topics: "partner.*", publisher: "webhook:partner"}
  - {topics: "other.*", publisher: "webhook:nobody"}
  - {topics: "x.*", publisher: "webhook:partner", max_pending: -1}
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	got := problems(t, cfg.Validate())
	for _, want := range []string{"webhooks[0].url", "webhooks[0].secrets[0]", "webhooks[1].name", "webhooks[1].secrets[0]", "routes[1].publisher", "routes[2].max_pending"} {
		if !slices.Contains(got, want) {
			t.Errorf("no problem for %s in %v", want, got)
		}
	}
}

// Check lists the file's problems, the environment's and the settings'
// together: one start-up says everything that is wrong.
func TestCheckListsFileAndSettingProblemsTogether(t *testing.T) {
	cfg, err := relayd.Parse([]byte(`
databases: [{url: "oracle://x", prefx: a_}]
nats: {url: "http://x"}
relay: {lease: soon, batch_size: -1}
`), env(map[string]string{"POSTBOX_MAX_ATTEMPTS": "many"}))
	if cfg == nil || !errors.Is(err, relayd.ErrBadYAML) {
		t.Fatalf("Parse = %v, %v", cfg, err)
	}
	err = relayd.Check(cfg, err)
	if !errors.Is(err, relayd.ErrBadYAML) {
		t.Fatalf("Check lost ErrBadYAML: %v", err)
	}
	got := strings.Join(problems(t, err), " ")
	want := "databases[0].prefx relay.lease POSTBOX_MAX_ATTEMPTS databases[0].url nats.url relay.batch_size"
	if got != want {
		t.Fatalf("fields\n got %s\nwant %s", got, want)
	}
	if _, err := relayd.Parse([]byte("{{{{"), env(nil)); relayd.Check(nil, err) != err { //nolint:errorlint // the very error, unchanged
		t.Fatal("Check of a file that is not YAML changed its error")
	}
	cfg, err = relayd.Parse([]byte("databases: [{url: \"postgres://h/db\"}]\n"), env(nil))
	if err := relayd.Check(cfg, err); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
}
