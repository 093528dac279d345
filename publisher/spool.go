package publisher

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Spool files. A segment is named after its number, zero-padded to 20 digits.
const (
	segSuffix   = ".seg"
	cursorName  = "cursor"
	cursorTmp   = "cursor.tmp"
	lockName    = "lock"
	recHeader   = 8       // uint32 payload length, uint32 CRC-32C of the payload
	maxRecord   = 1 << 30 // larger lengths are corruption
	writeBuffer = 256 << 10
)

var (
	castagnoli     = crc32.MakeTable(crc32.Castagnoli)
	errSpoolFull   = errors.New("spool full")
	errSpoolClosed = errors.New("spool closed")
)

// spoolPos is a record's position: segment number and byte offset.
type spoolPos struct {
	seg uint64
	off int64
}

// segment is a segment file and its size, including writes still buffered.
type segment struct {
	id   uint64
	size int64
}

// spoolRecord is one spooled batch.
type spoolRecord struct {
	partition int
	id        string
	count     int64
	data      []byte   // DecisionBatch bytes
	end       spoolPos // where the next record starts
}

// spool is the on-disk queue of batches that could not be published: append-only segment
// files of CRC-checked records, and a cursor saying where the unpublished records begin.
// Appends come from any goroutine; reads, commits and compaction from the replayer only.
type spool struct {
	dir      string
	maxBytes int64
	segBytes int64
	log      *slog.Logger
	drop     func(n int64, why string) // decisions lost to a failed write
	lock     *os.File

	mu        sync.Mutex
	segs      []segment // ascending; the last one is written
	w         *os.File
	bw        *bufio.Writer
	flushed   int64 // bytes of the last segment handed to the OS
	unflushed int64 // decisions in records not yet handed to the OS
	total     int64 // bytes of all segment files
	ack       spoolPos
	rf        *os.File // read side of segment rfID
	rfID      uint64
	hdr       []byte
	closed    bool

	pending atomic.Int64 // bytes of unpublished records: total - ack.off

	cursorMu sync.Mutex
	saved    spoolPos // cursor on disk
}

func segName(id uint64) string { return fmt.Sprintf("%020d%s", id, segSuffix) }

func (s *spool) path(name string) string { return filepath.Join(s.dir, name) }

// openSpool opens the spool in dir, creating it, and takes its lock: it verifies the records
// after the cursor, cuts a torn record at the end of a segment and opens the last segment for
// appending.
func openSpool(dir string, maxBytes, segBytes int64, log *slog.Logger, drop func(int64, string)) (*spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open spool lock: %w", err)
	}
	if err := lockFile(lf); err != nil {
		lf.Close()
		return nil, fmt.Errorf("spool %s is in use by another client: %w", dir, err)
	}
	s := &spool{dir: dir, maxBytes: maxBytes, segBytes: segBytes, log: log, drop: drop, lock: lf}
	if err := s.load(); err != nil {
		if s.w != nil {
			s.w.Close()
		}
		lf.Close()
		return nil, err
	}
	return s, nil
}

// load reads the folder: segments, cursor, and the validity of the unpublished records.
func (s *spool) load() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("read spool dir: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
		name := e.Name()
		if name == cursorTmp {
			os.Remove(s.path(name))
			continue
		}
		num, ok := strings.CutSuffix(name, segSuffix)
		if !ok || e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(num, 10, 64)
		if err != nil || id == 0 {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	cur, err := s.readCursor()
	if err != nil {
		if len(ids) > 0 {
			s.log.Warn("spool cursor unreadable: replaying the spool from its first segment", "err", err)
		}
		cur = spoolPos{}
	}
	s.saved = cur
	// Segments before the cursor's are published (their removal was cut short).
	for len(ids) > 0 && ids[0] < cur.seg {
		if err := os.Remove(s.path(segName(ids[0]))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove published spool segment: %w", err)
		}
		ids = ids[1:]
	}
	if len(ids) == 0 {
		id := max(cur.seg, 1)
		f, err := s.createSegment(id)
		if err != nil {
			return err
		}
		f.Close()
		ids = []uint64{id}
	}
	if ids[0] != cur.seg {
		cur = spoolPos{seg: ids[0]}
	}
	for i, id := range ids {
		start := int64(0)
		if id == cur.seg {
			start = cur.off
		}
		size, err := s.scanSegment(id, start, i == len(ids)-1)
		if err != nil {
			return err
		}
		if id == cur.seg && cur.off > size {
			cur.off = size
		}
		s.segs = append(s.segs, segment{id: id, size: size})
		s.total += size
	}
	last := s.segs[len(s.segs)-1]
	s.w, err = os.OpenFile(s.path(segName(last.id)), os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("open spool segment: %w", err)
	}
	s.bw = bufio.NewWriterSize(s.w, writeBuffer)
	s.flushed = last.size
	s.ack = cur
	s.pending.Store(s.total - s.ack.off)
	return nil
}

// scanSegment verifies the records of a segment from offset start and cuts the file at the
// first bad one, returning the size that remains.
func (s *spool) scanSegment(id uint64, start int64, last bool) (int64, error) {
	name := s.path(segName(id))
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("open spool segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat spool segment: %w", err)
	}
	size := st.Size()
	if start >= size {
		return size, nil
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, start, size-start), 1<<20)
	off := start
	var hdr [recHeader]byte
	var payload []byte
	var bad error
	for off < size {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			bad = fmt.Errorf("record header: %w", err)
			break
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		if n > maxRecord || off+recHeader+n > size {
			bad = fmt.Errorf("record of %d bytes past the end of the segment", n)
			break
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			bad = fmt.Errorf("record payload: %w", err)
			break
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			bad = errors.New("record checksum mismatch")
			break
		}
		if _, err := parsePayload(payload); err != nil {
			bad = err
			break
		}
		off += recHeader + n
	}
	if bad == nil {
		return size, nil
	}
	if last {
		s.log.Warn("spool: cutting a torn record at the end of the spool (a crash in mid-write)",
			"segment", name, "offset", off, "bytes", size-off, "err", bad)
	} else {
		s.log.Error("spool: corrupt record, losing the rest of its segment",
			"segment", name, "offset", off, "bytes", size-off, "err", bad)
	}
	if err := f.Truncate(off); err != nil {
		return 0, fmt.Errorf("truncate spool segment: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("sync spool segment: %w", err)
	}
	return off, nil
}

// parsePayload decodes a record's payload: partition, message id, count, batch bytes.
func parsePayload(p []byte) (spoolRecord, error) {
	var rec spoolRecord
	part, n := binary.Uvarint(p)
	if n <= 0 || part > 1<<20 {
		return rec, errors.New("record partition invalid")
	}
	p = p[n:]
	idLen, n := binary.Uvarint(p)
	if n <= 0 || idLen > uint64(len(p)-n) {
		return rec, errors.New("record message id invalid")
	}
	rec.id = string(p[n : n+int(idLen)])
	p = p[n+int(idLen):]
	count, n := binary.Uvarint(p)
	if n <= 0 || count > 1<<31 {
		return rec, errors.New("record count invalid")
	}
	rec.partition, rec.count, rec.data = int(part), int64(count), p[n:]
	return rec, nil
}

// createSegment creates an empty segment file for appending and syncs the folder.
func (s *spool) createSegment(id uint64) (*os.File, error) {
	f, err := os.OpenFile(s.path(segName(id)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("create spool segment: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open spool dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync spool dir: %w", err)
	}
	return nil
}

// append writes a record to the buffer of the last segment, starting a new segment first
// when the record would not fit. It returns errSpoolFull when the spool would exceed
// maxBytes.
func (s *spool) append(partition int, id string, count int, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSpoolClosed
	}
	h := append(s.hdr[:0], 0, 0, 0, 0, 0, 0, 0, 0) // header, filled in below
	h = binary.AppendUvarint(h, uint64(partition))
	h = binary.AppendUvarint(h, uint64(len(id)))
	h = append(h, id...)
	h = binary.AppendUvarint(h, uint64(count))
	s.hdr = h
	plen := len(h) - recHeader + len(data)
	size := int64(recHeader + plen)
	if s.total+size > s.maxBytes {
		return errSpoolFull
	}
	if last := s.segs[len(s.segs)-1]; last.size > 0 && last.size+size > s.segBytes {
		if err := s.roll(); err != nil {
			return err
		}
	}
	crc := crc32.Update(crc32.Checksum(h[recHeader:], castagnoli), castagnoli, data)
	binary.LittleEndian.PutUint32(h[0:4], uint32(plen))
	binary.LittleEndian.PutUint32(h[4:8], crc)
	if _, err := s.bw.Write(h); err != nil {
		return s.writeFailed(err)
	}
	if _, err := s.bw.Write(data); err != nil {
		return s.writeFailed(err)
	}
	s.segs[len(s.segs)-1].size += size
	s.total += size
	s.unflushed += int64(count)
	s.pending.Add(size)
	return nil
}

// writeFailed undoes the writes not yet handed to the OS, counting their decisions dropped,
// so that the segment ends with a whole record. s.mu must be held.
func (s *spool) writeFailed(err error) error {
	err = fmt.Errorf("write spool: %w", err)
	if s.unflushed > 0 {
		s.drop(s.unflushed, err.Error())
	}
	last := &s.segs[len(s.segs)-1]
	lost := last.size - s.flushed
	if terr := s.w.Truncate(s.flushed); terr != nil {
		err = errors.Join(err, fmt.Errorf("truncate spool segment: %w", terr))
	}
	s.bw.Reset(s.w)
	last.size = s.flushed
	s.total -= lost
	s.pending.Add(-lost)
	s.unflushed = 0
	return err
}

// roll fsyncs the last segment and starts the next one. s.mu must be held.
func (s *spool) roll() error {
	if err := s.flushLocked(); err != nil {
		return err
	}
	if err := s.w.Sync(); err != nil {
		s.log.Warn("spool: fsync of a full segment failed", "err", err)
	}
	id := s.segs[len(s.segs)-1].id + 1
	f, err := s.createSegment(id)
	if err != nil {
		return err
	}
	s.w.Close()
	s.w = f
	s.bw.Reset(f)
	s.flushed = 0
	s.segs = append(s.segs, segment{id: id})
	return nil
}

// flush hands the buffered writes to the OS.
func (s *spool) flush() {
	s.mu.Lock()
	s.flushLocked()
	s.mu.Unlock()
}

func (s *spool) flushLocked() error {
	size := s.segs[len(s.segs)-1].size
	if s.closed || s.flushed == size {
		return nil
	}
	if err := s.bw.Flush(); err != nil {
		return s.writeFailed(err)
	}
	s.flushed, s.unflushed = size, 0
	return nil
}

// read returns the record at p or, when p is the end of a segment, the first record of the
// next one; ok is false at the end of the spool. It hands buffered writes to the OS when it
// needs them.
func (s *spool) read(p spoolPos) (rec spoolRecord, ok bool, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return rec, false, nil
	}
	i, _ := slices.BinarySearchFunc(s.segs, p.seg, func(sg segment, id uint64) int {
		return cmpUint(sg.id, id)
	})
	if i == len(s.segs) {
		s.mu.Unlock()
		return rec, false, nil
	}
	if s.segs[i].id != p.seg {
		p = spoolPos{seg: s.segs[i].id}
	}
	var limit int64
	for {
		if i == len(s.segs)-1 {
			if p.off >= s.flushed {
				if err := s.flushLocked(); err != nil {
					s.mu.Unlock()
					return rec, false, nil // the failed writes are undone and counted
				}
			}
			limit = s.flushed
			if p.off >= limit {
				s.mu.Unlock()
				return rec, false, nil
			}
			break
		}
		limit = s.segs[i].size
		if p.off < limit {
			break
		}
		i++
		p = spoolPos{seg: s.segs[i].id}
	}
	f, err := s.reader(p.seg)
	s.mu.Unlock()
	if err != nil {
		return rec, false, err
	}
	var hdr [recHeader]byte
	if _, err := f.ReadAt(hdr[:], p.off); err != nil {
		return rec, false, fmt.Errorf("read spool record at %s:%d: %w", segName(p.seg), p.off, err)
	}
	n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
	if p.off+recHeader+n > limit {
		return rec, false, fmt.Errorf("spool record at %s:%d: length %d past the end", segName(p.seg), p.off, n)
	}
	payload := make([]byte, n)
	if _, err := f.ReadAt(payload, p.off+recHeader); err != nil {
		return rec, false, fmt.Errorf("read spool record at %s:%d: %w", segName(p.seg), p.off, err)
	}
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
		return rec, false, fmt.Errorf("spool record at %s:%d: checksum mismatch", segName(p.seg), p.off)
	}
	if rec, err = parsePayload(payload); err != nil {
		return rec, false, fmt.Errorf("spool record at %s:%d: %w", segName(p.seg), p.off, err)
	}
	rec.end = spoolPos{seg: p.seg, off: p.off + recHeader + n}
	return rec, true, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// reader returns a read-only file of segment id. s.mu must be held.
func (s *spool) reader(id uint64) (*os.File, error) {
	if s.rf != nil && s.rfID == id {
		return s.rf, nil
	}
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	f, err := os.Open(s.path(segName(id)))
	if err != nil {
		return nil, fmt.Errorf("open spool segment: %w", err)
	}
	s.rf, s.rfID = f, id
	return f, nil
}

// ackPos returns where the unpublished records begin.
func (s *spool) ackPos() spoolPos {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ack
}

// commit moves the cursor to p, every record before it being published, and removes the
// segments before p's.
func (s *spool) commit(p spoolPos) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.ack = p
	var gone []uint64
	for len(s.segs) > 1 && s.segs[0].id < p.seg {
		gone = append(gone, s.segs[0].id)
		s.total -= s.segs[0].size
		s.segs = s.segs[1:]
	}
	s.pending.Store(s.total - s.ack.off)
	s.dropReader(gone)
	s.mu.Unlock()
	s.remove(gone)
}

// skipSegment gives up the records of p's segment from p on: they cannot be read.
func (s *spool) skipSegment(p spoolPos) {
	s.mu.Lock()
	i := slices.IndexFunc(s.segs, func(sg segment) bool { return sg.id >= p.seg })
	if i < 0 {
		s.mu.Unlock()
		return
	}
	next := spoolPos{seg: s.segs[i].id, off: s.segs[i].size}
	if i == len(s.segs)-1 {
		s.flushLocked()
		next.off = s.segs[i].size
	}
	s.mu.Unlock()
	s.commit(next)
}

// empty reports whether every record is published.
func (s *spool) empty() bool { return s.pending.Load() == 0 }

// pendingBytes returns the size of the unpublished records.
func (s *spool) pendingBytes() int64 { return s.pending.Load() }

// compact replaces the segments by a new empty one when every record is published, so a
// drained spool takes no room.
func (s *spool) compact() {
	s.mu.Lock()
	if s.closed || s.total == 0 || s.total != s.ack.off {
		s.mu.Unlock()
		return
	}
	id := s.segs[len(s.segs)-1].id + 1
	f, err := s.createSegment(id)
	if err != nil {
		s.mu.Unlock()
		s.log.Warn("spool: cannot start a new segment", "err", err)
		return
	}
	gone := make([]uint64, 0, len(s.segs))
	for _, sg := range s.segs {
		gone = append(gone, sg.id)
	}
	s.w.Close()
	s.w = f
	s.bw.Reset(f)
	s.flushed, s.unflushed, s.total = 0, 0, 0
	s.segs = append(s.segs[:0], segment{id: id})
	s.ack = spoolPos{seg: id}
	s.pending.Store(0)
	s.dropReader(gone)
	s.mu.Unlock()
	s.saveCursor(false)
	s.remove(gone)
}

// dropReader closes the read side if it is one of the segments gone. s.mu must be held.
func (s *spool) dropReader(gone []uint64) {
	if s.rf != nil && slices.Contains(gone, s.rfID) {
		s.rf.Close()
		s.rf = nil
	}
}

func (s *spool) remove(gone []uint64) {
	for _, id := range gone {
		if err := os.Remove(s.path(segName(id))); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("spool: cannot remove a published segment", "err", err)
		}
	}
}

// saveCursor writes the cursor atomically (a temporary file renamed), fsynced when sync.
func (s *spool) saveCursor(sync bool) error {
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	s.mu.Lock()
	p := s.ack
	s.mu.Unlock()
	if p == s.saved && !sync {
		return nil
	}
	var b [20]byte
	binary.LittleEndian.PutUint64(b[0:8], p.seg)
	binary.LittleEndian.PutUint64(b[8:16], uint64(p.off))
	binary.LittleEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], castagnoli))
	tmp := s.path(cursorTmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	_, err = f.Write(b[:])
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	if err := os.Rename(tmp, s.path(cursorName)); err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	if sync {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	s.saved = p
	return nil
}

// readCursor reads the cursor file; a missing file is the zero position.
func (s *spool) readCursor() (spoolPos, error) {
	b, err := os.ReadFile(s.path(cursorName))
	if errors.Is(err, os.ErrNotExist) {
		return spoolPos{}, nil
	}
	if err != nil {
		return spoolPos{}, fmt.Errorf("read spool cursor: %w", err)
	}
	if len(b) != 20 || crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:20]) {
		return spoolPos{}, errors.New("spool cursor corrupt")
	}
	return spoolPos{seg: binary.LittleEndian.Uint64(b[0:8]), off: int64(binary.LittleEndian.Uint64(b[8:16]))}, nil
}

// close flushes and fsyncs the last segment, saves the cursor and releases the lock.
func (s *spool) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	err := s.flushLocked()
	if serr := s.w.Sync(); serr != nil {
		err = errors.Join(err, fmt.Errorf("sync spool segment: %w", serr))
	}
	s.w.Close()
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	s.closed = true
	s.mu.Unlock()
	if cerr := s.saveCursor(true); cerr != nil {
		err = errors.Join(err, cerr)
	}
	s.lock.Close()
	return err
}
