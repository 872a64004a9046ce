package diskio

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
)

// WriteFileAtomic replaces path with data durably: write a temp file, fsync it, rename it over
// path and fsync the directory. A crash leaves either the old content or the new.
func WriteFileAtomic(fs FS, path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp := path + ".tmp"
	if err := fs.Remove(tmp); err != nil && !errors.Is(err, ErrNotExist) {
		return err
	}
	f, err := fs.Create(tmp, Options{})
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, path); err != nil {
		return err
	}
	return fs.SyncDir(dir)
}

// ReadFile reads a whole (small) file, up to limit bytes; a longer file is an error.
func ReadFile(fs FS, path string, limit int) ([]byte, error) {
	f, err := fs.Open(path, Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	if size > int64(limit) {
		return nil, fmt.Errorf("diskio: %s is %d bytes, larger than the limit of %d", path, size, limit)
	}
	b := make([]byte, size)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}
