//! One stream's ring of records: the newest kept, bounded by a count floor and a byte bound, each at a position
//! that never changes, so a reader keeps a cursor and learns how many it lost when the ring moved past it.

use std::collections::VecDeque;

use bytes::Bytes;

/// Records a ring always keeps, whatever their bytes (DESIGN 6.2: at least 1,024 events).
pub const MIN_RECORDS: usize = 1024;

/// Records (each one JSON line, shared with every reader) at consecutive positions from `first`.
pub struct Ring {
    records: VecDeque<Bytes>,
    /// Position of `records[0]`.
    first: u64,
    bytes: usize,
    /// Bytes kept past the newest `MIN_RECORDS` (`debug.ring_bytes`).
    max_bytes: usize,
}

impl Ring {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            records: VecDeque::new(),
            first: 0,
            bytes: 0,
            max_bytes,
        }
    }

    /// Appends `record`; the oldest go while the ring holds more than `MIN_RECORDS` and more than `max_bytes`.
    /// Returns the position of the first record still kept.
    pub fn push(&mut self, record: Bytes) -> u64 {
        self.bytes = self.bytes.saturating_add(record.len());
        self.records.push_back(record);
        while self.records.len() > MIN_RECORDS && self.bytes > self.max_bytes {
            if let Some(old) = self.records.pop_front() {
                self.bytes -= old.len();
                self.first += 1;
            }
        }
        self.first
    }

    /// Position of the oldest record kept.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Position the next record gets.
    pub fn end(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// From position `from`: how many records were lost before the first kept one, and the records kept from
    /// there, up to `max_bytes` of them (at least one).
    pub fn read(&self, from: u64, max_bytes: usize) -> (u64, Vec<Bytes>) {
        let lost = self.first.saturating_sub(from);
        let start = usize::try_from(from.max(self.first) - self.first).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut taken = 0usize;
        for r in self.records.iter().skip(start) {
            if !out.is_empty() && taken + r.len() > max_bytes {
                break;
            }
            taken += r.len();
            out.push(r.clone());
        }
        (lost, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[test]
    fn keeps_the_count_floor_whatever_the_bytes() {
        let mut r = Ring::new(10);
        for _ in 0..MIN_RECORDS {
            r.push(rec(100));
        }
        assert_eq!(r.first(), 0, "nothing dropped at the floor");
        r.push(rec(100));
        assert_eq!(r.first(), 1);
        assert_eq!(r.end(), MIN_RECORDS as u64 + 1);
    }

    #[test]
    fn keeps_bytes_up_to_the_bound_past_the_floor() {
        let mut r = Ring::new(MIN_RECORDS * 10 + 50);
        for _ in 0..MIN_RECORDS + 5 {
            r.push(rec(10));
        }
        assert_eq!(r.first(), 0, "under the byte bound");
        for _ in 0..10 {
            r.push(rec(10));
        }
        assert!(r.first() > 0);
        assert!(r.bytes() <= MIN_RECORDS * 10 + 50);
    }

    #[test]
    fn a_reader_behind_the_ring_learns_how_many_it_lost() {
        let mut r = Ring::new(0);
        for i in 0..MIN_RECORDS + 3 {
            r.push(Bytes::from(i.to_string()));
        }
        let (lost, recs) = r.read(0, usize::MAX);
        assert_eq!(lost, 3);
        assert_eq!(recs.first().map(|b| b.as_ref()), Some(b"3".as_ref()));
        let (lost, recs) = r.read(r.end(), usize::MAX);
        assert_eq!((lost, recs.len()), (0, 0));
    }

    #[test]
    fn a_read_is_bounded_but_takes_at_least_one() {
        let mut r = Ring::new(1 << 20);
        r.push(rec(100));
        r.push(rec(100));
        assert_eq!(r.read(0, 10).1.len(), 1);
        assert_eq!(r.read(0, 200).1.len(), 2);
    }
}
