//! How inputs are made: a valid seed, mutated a few times, or pure noise.
//!
//! Byte-level mutations (bit flips, interesting bytes and little-endian words, inserted, deleted
//! and duplicated ranges, splices of two seeds, truncation, dictionary tokens) serve every
//! target. Text targets also get structure-aware ones: a number swapped for a huge, negative,
//! fractional or non-number one, a line duplicated (duplicate keys), dropped or swapped, a quoted
//! string replaced by an awkward one.

use crate::rng::Rng;

/// What a target's inputs look like, which decides the mutations used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Binary frames.
    Binary,
    /// Text (JSON, TOML, key=value lists, addresses).
    Text,
}

/// Inputs never grow beyond this many bytes.
pub const MAX_INPUT_LEN: usize = 1 << 16;

const INTERESTING_BYTES: [u8; 12] = [
    0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, b'0', b'9', b'-', b'"', b'\n',
];

const INTERESTING_WORDS: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

const INTERESTING_NUMBERS: [&str; 30] = [
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "255",
    "256",
    "65535",
    "65536",
    "-65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999999",
    "1e308",
    "1e309",
    "-1e400",
    "0.5",
    "1.0",
    "NaN",
    "nan",
    "inf",
    "-inf",
];

const INTERESTING_STRINGS: [&str; 14] = [
    "",
    " ",
    ".",
    "a.b",
    "[0]",
    "a,b",
    "a=b",
    "\\u0000",
    "\\ud800",
    "é",
    "😀",
    "tcp://*:0",
    "ipc://",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

/// Makes one input from `seeds` (which must not be empty) and the target's `dictionary`.
///
/// # Panics
/// When `seeds` is empty.
pub fn generate(rng: &mut Rng, seeds: &[Vec<u8>], shape: Shape, dictionary: &[&str]) -> Vec<u8> {
    if rng.one_in(16) {
        return noise(rng, shape, dictionary);
    }
    let mut input = rng.pick(seeds).clone();
    // Mostly one or a few mutations (inputs stay close to valid and reach the checks after
    // parsing), sometimes many.
    let n_mutations = match rng.below(8) {
        0..=3 => 1,
        4..=6 => 2 + rng.below(2),
        _ => 1 + rng.below(16),
    };
    for _ in 0..n_mutations {
        mutate(rng, &mut input, seeds, shape, dictionary);
    }
    input.truncate(MAX_INPUT_LEN);
    input
}

/// Random bytes, or for text targets mostly random dictionary tokens.
fn noise(rng: &mut Rng, shape: Shape, dictionary: &[&str]) -> Vec<u8> {
    let len = if rng.one_in(8) {
        rng.below(4096)
    } else {
        rng.below(64)
    };
    if shape == Shape::Text && !dictionary.is_empty() && !rng.one_in(4) {
        let mut text = Vec::new();
        while text.len() < len {
            text.extend_from_slice(rng.pick(dictionary).as_bytes());
            if rng.one_in(3) {
                text.push(*rng.pick(b" \n,=:{}[]\"'"));
            }
        }
        return text;
    }
    (0..len).map(|_| rng.byte()).collect()
}

fn mutate(
    rng: &mut Rng,
    input: &mut Vec<u8>,
    seeds: &[Vec<u8>],
    shape: Shape,
    dictionary: &[&str],
) {
    let n_kinds = if shape == Shape::Text { 16 } else { 11 };
    match rng.below(n_kinds) {
        0 => flip_bit(rng, input),
        1 => set_interesting_byte(rng, input),
        2 => set_interesting_word(rng, input),
        3 => insert_random_bytes(rng, input),
        4 => delete_range(rng, input),
        5 => duplicate_range(rng, input),
        6 => splice(rng, input, seeds),
        7 => truncate(rng, input),
        8 => insert_token(rng, input, dictionary),
        9 => {
            if !input.is_empty() {
                let at = rng.below(input.len());
                input[at] = rng.byte();
            }
        }
        10 => overwrite_with_copy(rng, input),
        11 => replace_number(rng, input),
        12 => duplicate_line(rng, input),
        13 => delete_line(rng, input),
        14 => swap_lines(rng, input),
        _ => replace_string(rng, input),
    }
    input.truncate(MAX_INPUT_LEN);
}

fn flip_bit(rng: &mut Rng, input: &mut [u8]) {
    if !input.is_empty() {
        let at = rng.below(input.len());
        input[at] ^= 1 << rng.below(8);
    }
}

fn set_interesting_byte(rng: &mut Rng, input: &mut [u8]) {
    if !input.is_empty() {
        let at = rng.below(input.len());
        input[at] = *rng.pick(&INTERESTING_BYTES);
    }
}

/// A 1, 2, 4 or 8 byte little-endian word set to an interesting value (counts, lengths, sizes).
fn set_interesting_word(rng: &mut Rng, input: &mut [u8]) {
    let width = 1 << rng.below(4);
    if input.len() < width {
        return;
    }
    let mut value = *rng.pick(&INTERESTING_WORDS);
    if rng.one_in(4) {
        value = value.wrapping_add(rng.below(3) as u64).wrapping_sub(1);
    }
    if rng.one_in(4) {
        value = input.len() as u64 + rng.below(3) as u64;
    }
    let at = rng.below(input.len() - width + 1);
    input[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

fn insert_random_bytes(rng: &mut Rng, input: &mut Vec<u8>) {
    let at = rng.below(input.len() + 1);
    let len = 1 + rng.below(16);
    let bytes: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
    input.splice(at..at, bytes);
}

fn delete_range(rng: &mut Rng, input: &mut Vec<u8>) {
    if input.is_empty() {
        return;
    }
    let start = rng.below(input.len());
    let len = 1 + rng.below((input.len() - start).min(64));
    input.drain(start..start + len);
}

fn duplicate_range(rng: &mut Rng, input: &mut Vec<u8>) {
    if input.is_empty() {
        return;
    }
    let start = rng.below(input.len());
    let len = 1 + rng.below((input.len() - start).min(256));
    let copy = input[start..start + len].to_vec();
    let at = rng.below(input.len() + 1);
    input.splice(at..at, copy);
}

fn overwrite_with_copy(rng: &mut Rng, input: &mut [u8]) {
    if input.len() < 2 {
        return;
    }
    let len = 1 + rng.below(input.len() / 2);
    let from = rng.below(input.len() - len + 1);
    let to = rng.below(input.len() - len + 1);
    input.copy_within(from..from + len, to);
}

/// The front of this input followed by the back of another seed.
fn splice(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let other = rng.pick(seeds);
    let cut = rng.below(input.len() + 1);
    let other_cut = rng.below(other.len() + 1);
    input.truncate(cut);
    input.extend_from_slice(&other[other_cut..]);
}

fn truncate(rng: &mut Rng, input: &mut Vec<u8>) {
    let len = rng.below(input.len() + 1);
    input.truncate(len);
}

fn insert_token(rng: &mut Rng, input: &mut Vec<u8>, dictionary: &[&str]) {
    if dictionary.is_empty() {
        return;
    }
    let at = rng.below(input.len() + 1);
    let token = rng.pick(dictionary).as_bytes().to_vec();
    input.splice(at..at, token);
}

/// Replaces a run of `[-+0-9.eE]` that contains a digit by an interesting number.
fn replace_number(rng: &mut Rng, input: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..input.len())
        .filter(|&at| input[at].is_ascii_digit() && (at == 0 || !is_number_byte(input[at - 1])))
        .collect();
    if starts.is_empty() {
        return;
    }
    let mut start = *rng.pick(&starts);
    if start > 0 && input[start - 1] == b'-' {
        start -= 1;
    }
    let mut end = start + 1;
    while end < input.len() && is_number_byte(input[end]) {
        end += 1;
    }
    let number = rng.pick(&INTERESTING_NUMBERS).as_bytes().to_vec();
    input.splice(start..end, number);
}

fn is_number_byte(byte: u8) -> bool {
    byte.is_ascii_digit() || matches!(byte, b'-' | b'+' | b'.' | b'e' | b'E' | b'_')
}

fn line_ranges(input: &[u8]) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    let mut start = 0;
    for (at, &byte) in input.iter().enumerate() {
        if byte == b'\n' {
            ranges.push((start, at + 1));
            start = at + 1;
        }
    }
    if start < input.len() {
        ranges.push((start, input.len()));
    }
    ranges
}

/// Duplicates a line: a duplicate key in TOML, a repeated member in pretty JSON.
fn duplicate_line(rng: &mut Rng, input: &mut Vec<u8>) {
    let lines = line_ranges(input);
    if lines.is_empty() {
        return;
    }
    let (start, end) = *rng.pick(&lines);
    let mut line = input[start..end].to_vec();
    if line.last() != Some(&b'\n') {
        line.insert(0, b'\n');
    }
    let (at, _) = *rng.pick(&lines);
    input.splice(at..at, line);
}

fn delete_line(rng: &mut Rng, input: &mut Vec<u8>) {
    let lines = line_ranges(input);
    if lines.is_empty() {
        return;
    }
    let (start, end) = *rng.pick(&lines);
    input.drain(start..end);
}

fn swap_lines(rng: &mut Rng, input: &mut Vec<u8>) {
    let lines = line_ranges(input);
    if lines.len() < 2 {
        return;
    }
    let mut order: Vec<(usize, usize)> = lines.clone();
    let first = rng.below(order.len());
    let second = rng.below(order.len());
    order.swap(first, second);
    let mut swapped = Vec::with_capacity(input.len() + 1);
    for (start, end) in order {
        swapped.extend_from_slice(&input[start..end]);
        if swapped.last() != Some(&b'\n') {
            swapped.push(b'\n');
        }
    }
    *input = swapped;
}

/// Replaces the contents of a `"..."` string by an awkward one.
fn replace_string(rng: &mut Rng, input: &mut Vec<u8>) {
    let quotes: Vec<usize> = (0..input.len()).filter(|&at| input[at] == b'"').collect();
    if quotes.len() < 2 {
        return;
    }
    let pair = rng.below(quotes.len() - 1);
    let (start, end) = (quotes[pair] + 1, quotes[pair + 1]);
    let replacement = rng.pick(&INTERESTING_STRINGS).as_bytes().to_vec();
    input.splice(start..end, replacement);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_bounded_and_varied() {
        let seeds = vec![
            b"{\"a\": 12, \"b\": [1, 2]}\nx = 3\n".to_vec(),
            vec![0u8; 40],
        ];
        let make = |index| {
            let mut rng = Rng::for_input(3, index);
            generate(&mut rng, &seeds, Shape::Text, &["[[device]]", "="])
        };
        let inputs: Vec<Vec<u8>> = (0..2000).map(make).collect();
        assert!(inputs.iter().all(|input| input.len() <= MAX_INPUT_LEN));
        assert_eq!(inputs[17], make(17));
        let distinct: std::collections::BTreeSet<&Vec<u8>> = inputs.iter().collect();
        assert!(
            distinct.len() > 1000,
            "only {} distinct inputs",
            distinct.len()
        );
    }

    #[test]
    fn replace_number_swaps_a_whole_number() {
        let mut rng = Rng::new(5);
        let mut input = b"linger = 500\n".to_vec();
        replace_number(&mut rng, &mut input);
        let text = String::from_utf8(input).unwrap();
        assert!(
            text.starts_with("linger = ") && !text.contains("500"),
            "{text}"
        );
    }
}
