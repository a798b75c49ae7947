package postbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	d := postboxpgx.New(pool)
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	pub := postbox.PublisherFunc(func(ctx context.Context, env *postbox.Envelope) error {
		mu.Lock()
		got = append(got, env.Key+":"+string(env.Payload))
		mu.Unlock()
		return nil
	})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := c.Write(ctx, postbox.Message{Topic: "a.b", Key: "k", Payload: []byte{byte('0' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Log(got)
	s, _ := c.Stats(ctx)
	t.Logf("%+v", s)
}
