//! The task order: a seeded permutation of the training tasks per epoch and a cursor into it.
//! The cursor is all the state there is, so a checkpoint holding it resumes exactly, at an
//! epoch boundary included (no task skipped or repeated, unlike the verl bugs #5725 and #7401
//! where a resumed data loader restarted or skipped its epoch).

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::seed::{Phase, derive_seed};

/// A position in the task order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The epoch (one pass over the tasks).
    pub epoch: u64,
    /// Tasks of this epoch already drawn.
    pub index: usize,
}

/// Draw numbers of [`TaskOrder::extra`] start here, so that no extra draw shares a draw number
/// (and with it the episode seeds of [`crate::seed::derive_seed`]) with a draw of the main order.
pub const EXTRA_DRAW_BASE: u64 = 1 << 48;

/// Draws tasks in a per-epoch seeded order.
#[derive(Debug, Clone)]
pub struct TaskOrder {
    seed: u64,
    /// 0: the main order every method draws its batches from; 1: the extra stream.
    stream: u64,
    len: usize,
    shuffle: bool,
    cursor: Cursor,
    permutation: Vec<usize>,
}

impl TaskOrder {
    /// An order over `len` tasks starting at `cursor`.
    pub fn new(seed: u64, len: usize, shuffle: bool, cursor: Cursor) -> Self {
        Self::with_stream(seed, 0, len, shuffle, cursor)
    }

    /// The stream of extra draws (DAPO's dynamic sampling draws more tasks than a batch): its
    /// own permutations and its own draw numbers (from [`EXTRA_DRAW_BASE`]), so that drawing
    /// from it leaves the main order, and with it the tasks and seeds of every later update,
    /// the same as every other method's.
    pub fn extra(seed: u64, len: usize, shuffle: bool, cursor: Cursor) -> Self {
        Self::with_stream(seed, 1, len, shuffle, cursor)
    }

    fn with_stream(seed: u64, stream: u64, len: usize, shuffle: bool, cursor: Cursor) -> Self {
        let mut order = TaskOrder {
            seed,
            stream,
            len,
            shuffle,
            cursor,
            permutation: Vec::new(),
        };
        order.permutation = order.permutation_of(cursor.epoch);
        order
    }

    /// The task indices of `epoch`, in order.
    pub fn permutation_of(&self, epoch: u64) -> Vec<usize> {
        let mut p: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(
                self.seed,
                Phase::Order,
                epoch,
                "",
                0,
                self.stream,
            ));
            p.shuffle(&mut rng);
        }
        p
    }

    /// Where the next draw starts.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next `n` tasks as `(task index, draw number)`; the draw number counts every draw of
    /// the run, so it is unique per draw.
    pub fn draw(&mut self, n: usize) -> Vec<(usize, u64)> {
        let mut out = Vec::with_capacity(n);
        if self.len == 0 {
            return out;
        }
        for _ in 0..n {
            if self.cursor.index >= self.len {
                self.cursor = Cursor {
                    epoch: self.cursor.epoch + 1,
                    index: 0,
                };
                self.permutation = self.permutation_of(self.cursor.epoch);
            }
            let draw = self.stream * EXTRA_DRAW_BASE
                + self.cursor.epoch * self.len as u64
                + self.cursor.index as u64;
            out.push((self.permutation[self.cursor.index], draw));
            self.cursor.index += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_is_a_permutation_and_a_restart_from_any_cursor_continues_it() {
        let mut order = TaskOrder::new(3, 5, true, Cursor::default());
        let all: Vec<usize> = order.draw(15).into_iter().map(|(i, _)| i).collect();
        for epoch in all.chunks(5) {
            let mut sorted = epoch.to_vec();
            sorted.sort();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        }
        for split in 0..15 {
            let mut a = TaskOrder::new(3, 5, true, Cursor::default());
            let mut first: Vec<usize> = a.draw(split).into_iter().map(|(i, _)| i).collect();
            let mut b = TaskOrder::new(3, 5, true, a.cursor());
            first.extend(b.draw(15 - split).into_iter().map(|(i, _)| i));
            assert_eq!(first, all, "restart after {split} draws");
        }
    }

    #[test]
    fn the_extra_stream_has_its_own_order_and_draw_numbers() {
        let mut main = TaskOrder::new(3, 50, true, Cursor::default());
        let mut extra = TaskOrder::extra(3, 50, true, Cursor::default());
        let a = main.draw(50);
        let b = extra.draw(50);
        assert_ne!(
            a.iter().map(|d| d.0).collect::<Vec<_>>(),
            b.iter().map(|d| d.0).collect::<Vec<_>>()
        );
        assert!(b.iter().all(|d| d.1 >= EXTRA_DRAW_BASE));
        assert!(a.iter().all(|d| d.1 < EXTRA_DRAW_BASE));
    }
}
