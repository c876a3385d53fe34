//! Coalitions as compact bitsets. A batch stores many coalitions back to back in one flat
//! vector of words, so a game values thousands of coalitions without an allocation each.

/// Maps and sets keyed by coalitions: foldhash with a fixed seed (a few words hash far
/// faster than with SipHash, and iteration order does not depend on the process).
pub type CoalitionMap<V> = std::collections::HashMap<Vec<u64>, V, foldhash::fast::FixedState>;
pub type CoalitionSet<'a> = std::collections::HashSet<&'a [u64], foldhash::fast::FixedState>;

/// Words (64 players each) needed for `n_players` players.
pub fn words_for(n_players: usize) -> usize {
    n_players.div_ceil(64).max(1)
}

pub fn contains(set: &[u64], player: usize) -> bool {
    set[player / 64] >> (player % 64) & 1 == 1
}

pub fn insert(set: &mut [u64], player: usize) {
    set[player / 64] |= 1 << (player % 64);
}

pub fn size(set: &[u64]) -> usize {
    set.iter().map(|w| w.count_ones() as usize).sum()
}

/// The players of `set`, ascending, into `out`.
pub fn members_of(set: &[u64], out: &mut Vec<usize>) {
    out.clear();
    for_each_member(set, |player| out.push(player));
}

/// `visit` on each player of `set`, ascending (what [`members_of`] lists).
#[inline(always)]
pub fn for_each_member(set: &[u64], mut visit: impl FnMut(usize)) {
    for (w, &word) in set.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            visit(w * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
}

/// Each byte's bits as eight booleans, lowest first.
const BYTE_BOOLS: [[bool; 8]; 256] = {
    let mut table = [[false; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut bit = 0;
        while bit < 8 {
            table[byte][bit] = byte >> bit & 1 == 1;
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// `inner` is a subset of `outer`.
pub fn is_subset(inner: &[u64], outer: &[u64]) -> bool {
    inner.iter().zip(outer).all(|(a, b)| a & !b == 0)
}

/// A batch of coalitions of the same `n_players` players.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coalitions {
    n_players: usize,
    words: usize,
    bits: Vec<u64>,
}

impl Coalitions {
    pub fn new(n_players: usize) -> Self {
        Coalitions { n_players, words: words_for(n_players), bits: Vec::new() }
    }

    pub fn with_capacity(n_players: usize, capacity: usize) -> Self {
        let mut batch = Self::new(n_players);
        batch.bits.reserve(capacity * batch.words);
        batch
    }

    pub fn n_players(&self) -> usize {
        self.n_players
    }

    /// Words per coalition.
    pub fn words(&self) -> usize {
        self.words
    }

    pub fn len(&self) -> usize {
        self.bits.len() / self.words
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    pub fn get(&self, index: usize) -> &[u64] {
        &self.bits[index * self.words..(index + 1) * self.words]
    }

    /// Appends the empty coalition and returns it for filling.
    pub fn push_empty(&mut self) -> &mut [u64] {
        let start = self.bits.len();
        self.bits.resize(start + self.words, 0);
        &mut self.bits[start..]
    }

    pub fn push(&mut self, set: &[u64]) {
        self.bits.extend_from_slice(set);
    }

    /// Appends the coalition of the listed players.
    pub fn push_players(&mut self, players: impl IntoIterator<Item = usize>) {
        let set = self.push_empty();
        for player in players {
            insert(set, player);
        }
    }

    /// Appends the coalition whose first 64 players are the bits of `mask`.
    pub fn push_mask(&mut self, mask: u64) {
        self.push_empty()[0] = mask;
    }

    /// A copy of the coalitions at positions `rows`.
    pub fn slice(&self, rows: std::ops::Range<usize>) -> Coalitions {
        let bits = self.bits[rows.start * self.words..rows.end * self.words].to_vec();
        Coalitions { n_players: self.n_players, words: self.words, bits }
    }

    /// Keeps the first `len` coalitions.
    pub fn truncate(&mut self, len: usize) {
        self.bits.truncate(len * self.words);
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u64]> {
        self.bits.chunks_exact(self.words)
    }

    /// The flat words, `words()` per coalition.
    pub fn as_words(&self) -> &[u64] {
        &self.bits
    }

    /// Builds a batch from flat words (`words_for(n_players)` per coalition); bits at or past
    /// `n_players` must be clear.
    pub fn from_words(n_players: usize, bits: Vec<u64>) -> Option<Self> {
        let words = words_for(n_players);
        if !bits.len().is_multiple_of(words) {
            return None;
        }
        let tail = n_players % 64;
        let clean = tail == 0 || bits.chunks_exact(words).all(|set| set[words - 1] >> tail == 0);
        clean.then_some(Coalitions { n_players, words, bits })
    }

    /// Row-major booleans, `n_players` per coalition (the layout numpy masks have).
    pub fn to_bools(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.len() * self.n_players);
        for set in self.iter() {
            // A byte of the set at a time (a table lookup, not a bit test per player).
            let mut left = self.n_players;
            for byte in set.iter().flat_map(|word| word.to_le_bytes()) {
                let take = left.min(8);
                out.extend_from_slice(&BYTE_BOOLS[byte as usize][..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        out
    }
}
