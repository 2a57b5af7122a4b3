//! What ranks agree on before a collective: a typed descriptor of the call ([`Call`]: which
//! collective, element type, count, in place or not, sequence number). The in-process
//! communicator compares the calls its ranks announce; MPI processes exchange them as wire
//! words ([`Call::encode`], [`Call::decode`]). Either way a disagreement is an error on every
//! rank naming the rank that differs and both calls ([`Call::describe`]).

use std::fmt::Debug;
use std::hash::Hash;

use thiserror::Error;

use super::schedule::Algorithm;
use crate::dtype::DType;

/// Reduction operators (a part of the call every rank must pass alike; the communicator
/// re-exports it as `communicator::ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum divided by the number of ranks.
    Avg,
}

/// An algorithm choice that travels in an agreement descriptor as a number.
pub trait AlgorithmCode: Copy + Debug + PartialEq + Eq + Hash {
    /// Its number on the wire (never 0).
    fn code(self) -> u64;
    /// The algorithm of a number, if it is one.
    fn from_code(code: u64) -> Option<Self>;
    /// Lower-case name, for messages.
    fn name(self) -> &'static str;
}

impl AlgorithmCode for Algorithm {
    fn code(self) -> u64 {
        1 + Algorithm::ALL.iter().position(|x| *x == self).unwrap_or(0) as u64
    }
    fn from_code(code: u64) -> Option<Self> {
        let index = usize::try_from(code).ok()?.checked_sub(1)?;
        Algorithm::ALL.get(index).copied()
    }
    fn name(self) -> &'static str {
        Algorithm::name(self)
    }
}

/// Which collective, with its arguments that every rank must pass alike; `A` is how an
/// allreduce is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind<A> {
    /// Allreduce with this algorithm and operator.
    AllReduce(A, ReduceOp),
    /// Reduce-scatter with this operator.
    ReduceScatter(ReduceOp),
    /// All-gather.
    AllGather,
    /// Broadcast from this root.
    Broadcast(usize),
    /// Barrier.
    Barrier,
}

/// One rank's call of a collective, as the ranks agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<A> {
    /// The collective's number on this communicator, from 1.
    pub seq: u64,
    /// Which collective.
    pub kind: Kind<A>,
    /// Element type.
    pub dtype: DType,
    /// Elements per rank.
    pub count: usize,
    /// Whether output and input are the same buffer.
    pub in_place: bool,
}

/// A descriptor word that names nothing this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("an agreement descriptor whose {field} code is {code}, which names nothing known here")]
pub struct BadCode {
    /// Which field.
    pub field: &'static str,
    /// Its value.
    pub code: u64,
}

/// Words of an encoded [`Call`].
pub const WORDS: usize = 7;

fn op_code(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Avg => 1,
    }
}

fn op_of(code: u64) -> Result<ReduceOp, BadCode> {
    match code {
        0 => Ok(ReduceOp::Sum),
        1 => Ok(ReduceOp::Avg),
        code => Err(BadCode {
            field: "operator",
            code,
        }),
    }
}

impl<A: AlgorithmCode> Call<A> {
    /// The call as wire words: sequence, kind, the kind's parameter (algorithm or root),
    /// operator, element type, count, in place.
    pub fn encode(&self) -> [u64; WORDS] {
        let (kind, param, op) = match self.kind {
            Kind::AllReduce(a, op) => (1, a.code(), op_code(op)),
            Kind::ReduceScatter(op) => (2, 0, op_code(op)),
            Kind::AllGather => (3, 0, 0),
            Kind::Broadcast(root) => (4, root as u64, 0),
            Kind::Barrier => (5, 0, 0),
        };
        let dtype = self.dtype.code();
        [
            self.seq,
            kind,
            param,
            op,
            dtype,
            self.count as u64,
            u64::from(self.in_place),
        ]
    }

    /// The call that `words` encode, or which word holds a code that names nothing.
    pub fn decode(words: &[u64; WORDS]) -> Result<Self, BadCode> {
        let [seq, kind, param, op, dtype, count, in_place] = *words;
        let bad = |field, code| BadCode { field, code };
        let kind = match kind {
            1 => Kind::AllReduce(
                A::from_code(param).ok_or(bad("algorithm", param))?,
                op_of(op)?,
            ),
            2 => Kind::ReduceScatter(op_of(op)?),
            3 => Kind::AllGather,
            4 => Kind::Broadcast(usize::try_from(param).map_err(|_| bad("root", param))?),
            5 => Kind::Barrier,
            code => return Err(bad("collective", code)),
        };
        Ok(Call {
            seq,
            kind,
            dtype: DType::from_code(dtype).ok_or_else(|| bad("element type", dtype))?,
            count: usize::try_from(count).map_err(|_| bad("count", count))?,
            in_place: match in_place {
                0 => false,
                1 => true,
                code => return Err(bad("in place", code)),
            },
        })
    }

    /// The call in words, for error messages.
    pub fn describe(&self) -> String {
        let op = |op: ReduceOp| match op {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
        };
        let kind = match self.kind {
            Kind::AllReduce(a, o) => format!("all_reduce ({}, {})", a.name(), op(o)),
            Kind::ReduceScatter(o) => format!("reduce_scatter ({})", op(o)),
            Kind::AllGather => "all_gather".into(),
            Kind::Broadcast(root) => format!("broadcast from rank {root}"),
            Kind::Barrier => "barrier".into(),
        };
        format!(
            "{kind} of {} {} elements{} (collective #{})",
            self.count,
            self.dtype,
            if self.in_place { " in place" } else { "" },
            self.seq
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_round_trip_through_wire_words_and_bad_codes_are_named() {
        let kinds = [
            Kind::AllReduce(Algorithm::Ring, ReduceOp::Avg),
            Kind::ReduceScatter(ReduceOp::Sum),
            Kind::AllGather,
            Kind::Broadcast(3),
            Kind::Barrier,
        ];
        for kind in kinds {
            let call = Call {
                seq: 7,
                kind,
                dtype: DType::F16,
                count: 1000,
                in_place: true,
            };
            assert_eq!(Call::decode(&call.encode()), Ok(call));
        }
        let mut words = Call {
            seq: 1,
            kind: Kind::AllReduce(Algorithm::Ring, ReduceOp::Sum),
            dtype: DType::F32,
            count: 4,
            in_place: false,
        }
        .encode();
        words[2] = 98;
        let err = Call::<Algorithm>::decode(&words).unwrap_err();
        assert_eq!(
            err,
            BadCode {
                field: "algorithm",
                code: 98
            }
        );
        assert!(err.to_string().contains("algorithm code is 98"), "{err}");
    }
}
