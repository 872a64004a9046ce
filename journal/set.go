package journal

import "errors"

// Set is the journals of a bookie, one per journal directory. Ledger L is journaled in journal
// L mod n (BookKeeper's getJournal), so a ledger's records keep their order. Each journal has
// its own writer and its own mark.
type Set struct {
	journals []*Journal
}

// OpenSet opens one journal per config. On error it closes those already open.
func OpenSet(cfgs []Config) (*Set, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("journal: no journal directories")
	}
	s := &Set{}
	for _, cfg := range cfgs {
		j, err := Open(cfg)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.journals = append(s.journals, j)
	}
	return s, nil
}

// For returns the journal of ledgerID.
func (s *Set) For(ledgerID int64) *Journal {
	return s.journals[Index(ledgerID, len(s.journals))]
}

// Index is the journal index of ledgerID among n journals (sign-safe modulo).
func Index(ledgerID int64, n int) int {
	i := int(ledgerID % int64(n))
	if i < 0 {
		i += n
	}
	return i
}

// Journals returns the journals, by index.
func (s *Set) Journals() []*Journal { return s.journals }

// Marks returns each journal's LastLogMark, by index.
func (s *Set) Marks() []Mark {
	marks := make([]Mark, len(s.journals))
	for i, j := range s.journals {
		marks[i] = j.LastLogMark()
	}
	return marks
}

// Close closes every journal and returns the first error.
func (s *Set) Close() error {
	var errs []error
	for _, j := range s.journals {
		errs = append(errs, j.Close())
	}
	return errors.Join(errs...)
}
