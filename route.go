package postbox

import (
	"context"
	"fmt"
	"strings"
)

// Route sends the messages whose topic matches Topics to Publisher.
// Topics is an exact topic ("orders.created"), a prefix ending in "*"
// ("orders.*" matches every topic starting with "orders."), or "*" alone
// for every topic.
type Route struct {
	Topics    string
	Publisher Publisher
}

// ValidateTopicPattern reports whether p is a valid route pattern.
func ValidateTopicPattern(p string) error {
	if p == "*" {
		return nil
	}
	lit, _ := strings.CutSuffix(p, "*")
	if err := ValidateTopic(lit); err != nil {
		ve := err.(*ValidationError) //nolint:errorlint // always this type
		ve.Field, ve.Value = "topics", p
		ve.Reason = "is not a topic, a topic prefix ending in *, or *: the topic part " + ve.Reason
		return ve
	}
	return nil
}

func matchTopic(pattern, topic string) bool {
	if lit, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(topic, lit)
	}
	return pattern == topic
}

// routes is the relay's view of Config.Routes and Config.Publisher: the
// patterns it fetches, and the publisher of each topic.
type routes []Route

// effectiveRoutes returns the routes in force: Config.Routes, then
// Config.Publisher as the route for everything else.
func (c *Config) effectiveRoutes() routes {
	rs := append(routes(nil), c.Routes...)
	if c.Publisher != nil {
		rs = append(rs, Route{Topics: "*", Publisher: c.Publisher})
	}
	return rs
}

// patterns returns what the relay fetches: nil (every topic) when a route
// matches everything.
func (rs routes) patterns() []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		if r.Topics == "*" {
			return nil
		}
		out = append(out, r.Topics)
	}
	return out
}

func (rs routes) route(topic string) Publisher {
	for _, r := range rs {
		if matchTopic(r.Topics, topic) {
			return r.Publisher
		}
	}
	return nil
}

// Publish implements Publisher by handing env to its route's publisher.
// The relay fetches only routed topics, so a miss means the routes changed
// under it; it waits for a relay that knows the topic.
func (rs routes) Publish(ctx context.Context, env *Envelope, done func(error)) {
	if p := rs.route(env.Topic); p != nil {
		p.Publish(ctx, env, done)
		return
	}
	done(fmt.Errorf("postbox: no route for topic %q", env.Topic))
}
