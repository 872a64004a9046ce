package etcd

import (
	"bytes"
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// cookieStore implements metadata.CookieStore. Versions are ModRevisions.
type cookieStore struct {
	d *Driver
}

var _ metadata.CookieStore = (*cookieStore)(nil)

func (s *cookieStore) check(bookieID string) error {
	if err := s.d.checkOpen(); err != nil {
		return err
	}
	return metadata.ValidateBookieID(bookieID)
}

// Read implements metadata.CookieStore.
func (s *cookieStore) Read(ctx context.Context, bookieID string) ([]byte, metadata.Version, error) {
	if err := s.check(bookieID); err != nil {
		return nil, 0, err
	}
	resp, err := s.d.cli.Get(ctx, s.d.keys.cookie(bookieID))
	if err != nil {
		return nil, 0, s.d.opErr("read cookie "+bookieID, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("%w: bookie %s", metadata.ErrNoSuchCookie, bookieID)
	}
	return bytes.Clone(resp.Kvs[0].Value), metadata.Version(resp.Kvs[0].ModRevision), nil
}

// Write implements metadata.CookieStore.
func (s *cookieStore) Write(ctx context.Context, bookieID string, cookie []byte, expected metadata.Version) (metadata.Version, error) {
	if err := s.check(bookieID); err != nil {
		return 0, err
	}
	key := s.d.keys.cookie(bookieID)
	var cmp []clientv3.Cmp
	switch expected {
	case metadata.AnyVersion:
	case metadata.NoVersion:
		cmp = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	default:
		cmp = versionIs(key, expected)
	}
	resp, err := s.d.cli.Txn(ctx).
		If(cmp...).
		Then(clientv3.OpPut(key, string(cookie))).
		Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, s.d.opErr("write cookie "+bookieID, err)
	}
	if !resp.Succeeded {
		return 0, cookieConflict(bookieID, expected, resp)
	}
	return metadata.Version(resp.Header.Revision), nil
}

// Delete implements metadata.CookieStore.
func (s *cookieStore) Delete(ctx context.Context, bookieID string, expected metadata.Version) error {
	if err := s.check(bookieID); err != nil {
		return err
	}
	key := s.d.keys.cookie(bookieID)
	resp, err := s.d.cli.Txn(ctx).
		If(versionIs(key, expected)...).
		Then(clientv3.OpDelete(key)).
		Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return s.d.opErr("delete cookie "+bookieID, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return fmt.Errorf("%w: bookie %s", metadata.ErrNoSuchCookie, bookieID)
		}
		return cookieConflict(bookieID, expected, resp)
	}
	return nil
}

func cookieConflict(bookieID string, expected metadata.Version, resp *clientv3.TxnResponse) error {
	current := metadata.NoVersion
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		current = metadata.Version(kvs[0].ModRevision)
	}
	return &metadata.BadVersionError{What: "cookie " + bookieID, Expected: expected, Current: current}
}
