package postboxadmin

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"html/template"
	"net/http"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// dashboardRows bounds each list on the dashboard.
const dashboardRows = 20

// dashboardStyle is the page's only style; the Content-Security-Policy
// allows it by hash and nothing else (no scripts, no external assets).
const dashboardStyle = `body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0 0 2em}
th,td{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}
.muted{color:#777}`

var dashboardCSP = func() string {
	sum := sha256.Sum256([]byte(dashboardStyle))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

var dashboardPage = template.Must(template.New("dashboard").Funcs(template.FuncMap{
	"age":  func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"when": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"cut":  func(s string) string { return configcheck.ShortenTo(s, 120) },
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>postbox</title>
<style>` + dashboardStyle + `</style>
</head>
<body>
<h1>postbox</h1>
<p>Pending <b>{{.Status.Pending}}</b> (oldest {{age .Status.OldestPendingAge}}) · dead <b>{{.Status.Dead}}</b> · published kept {{.Status.Published}}
<span class="muted">· as of {{when .Now}}</span></p>
{{with .Status.HeldSnapshot}}<p>Oldest snapshot held by another session: pid {{.PID}} ({{.State}}) for {{age .Age}}; the outbox's dead rows stay until it ends.</p>{{end}}

<h2>Topics</h2>
{{if .Status.Topics}}<table>
<tr><th>topic</th><th>pending</th><th>oldest pending</th><th>dead</th><th>published, last minute</th></tr>
{{range .Status.Topics}}<tr><td>{{.Topic}}{{if not (call $.Routed .Topic)}} <span class="muted">(unrouted: waits for a relay that routes it)</span>{{end}}</td><td class="n">{{.Pending}}</td><td class="n">{{age .OldestPendingAge}}</td><td class="n">{{.Dead}}</td><td class="n">{{.PublishedLastMinute}}</td></tr>
{{end}}</table>{{else}}<p class="muted">Nothing pending, dead or published in the last minute.</p>{{end}}

<h2>Latest dead messages</h2>
{{if .Dead}}<table>
<tr><th>id</th><th>topic</th><th>key</th><th>attempts</th><th>dead at</th><th>last error</th></tr>
{{range .Dead}}<tr><td><code>{{.ID}}</code></td><td>{{.Topic}}</td><td>{{.Key}}</td><td class="n">{{.Attempts}}</td><td>{{when .DeadAt}}</td><td>{{cut .Error}}</td></tr>
{{end}}</table>{{else}}<p class="muted">None.</p>{{end}}

{{if .HasConsumers}}<h2>Latest consumers' dead messages</h2>
{{if .Letters}}<table>
<tr><th>consumer</th><th>message id</th><th>topic</th><th>attempts</th><th>dead at</th><th>error</th></tr>
{{range .Letters}}<tr><td>{{.Consumer}}</td><td><code>{{.ID}}</code></td><td>{{.Topic}}</td><td class="n">{{.Attempts}}</td><td>{{when .DeadAt}}</td><td>{{cut .Error}}</td></tr>
{{end}}</table>{{else}}<p class="muted">None.</p>{{end}}{{end}}

<p class="muted">Read-only. Requeue, delete, replay and prune through the API (/v1/...) or the postbox CLI.</p>
</body>
</html>
`))

type dashboardData struct {
	Now          time.Time
	Routed       func(topic string) bool
	Status       postbox.Status
	Dead         []postbox.DeadMessage
	HasConsumers bool
	Letters      []postbox.DeadMessage
}

func (s *Server) dashboard(w http.ResponseWriter, r *http.Request, _ principal) error {
	if _, err := query(r); err != nil {
		return err
	}
	ctx := r.Context()
	d := dashboardData{Now: time.Now(), Routed: s.routed}
	var err error
	if d.Status, err = s.cfg.Admin.Status(ctx); err != nil {
		return err
	}
	if d.Dead, err = s.cfg.Admin.ListDead(ctx, postbox.DeadFilter{Limit: dashboardRows}); err != nil {
		return err
	}
	if s.cfg.ConsumerDead != nil {
		d.HasConsumers = true
		if d.Letters, err = s.cfg.ConsumerDead.ListDead(ctx, postbox.DeadFilter{Limit: dashboardRows}); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := dashboardPage.Execute(&buf, d); err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, _ = buf.WriteTo(w)
	return nil
}
