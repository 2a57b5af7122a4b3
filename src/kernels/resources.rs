//! ptxas's resource report (`nvcc -Xptxas -v`), parsed: registers, spills, shared memory
//! and stack per kernel and architecture.
//!
//! Spills matter because a spilled register lives in local memory (DRAM behind L1), which
//! can turn a compute-bound kernel memory-bound; the test suite fails on any spill.

use thiserror::Error;

/// What ptxas reported for one entry function compiled for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    /// Kernel (entry function) name.
    pub kernel: String,
    /// Real architecture, e.g. `sm_80`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Named barriers used.
    pub barriers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u64,
    /// Per-thread stack frame, bytes.
    pub stack_bytes: u64,
    /// Bytes of registers spilled to local memory (stores).
    pub spill_store_bytes: u64,
    /// Bytes of registers reloaded from local memory.
    pub spill_load_bytes: u64,
}

impl KernelResources {
    /// True when ptxas had to spill registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// A report that does not read as ptxas output.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReportError {
    /// A line that should hold numbers did not.
    #[error("ptxas report line {line}: cannot read {what} from {text:?}")]
    Malformed {
        /// 1-based line number in the report.
        line: usize,
        /// The field being read.
        what: &'static str,
        /// The offending line.
        text: String,
    },
    /// An entry function whose register line never came.
    #[error("ptxas report: entry function {kernel} for {arch} has no `Used N registers` line")]
    Incomplete {
        /// Kernel name.
        kernel: String,
        /// Architecture.
        arch: String,
    },
}

/// Parses a whole `-Xptxas -v` report into one record per (kernel, arch), in report order.
pub fn parse(report: &str) -> Result<Vec<KernelResources>, ReportError> {
    let mut done = Vec::new();
    let mut current: Option<KernelResources> = None;
    // Name from the last `Function properties for X` line: the stack/spill line that follows
    // belongs to X, which may be a non-inlined device function rather than the entry.
    let mut properties_of: Option<String> = None;
    for (i, line) in report.lines().enumerate() {
        let n = i + 1;
        let bad = |what| ReportError::Malformed {
            line: n,
            what,
            text: line.to_string(),
        };
        if let Some(rest) = line
            .split_once("Compiling entry function '")
            .map(|(_, r)| r)
        {
            if let Some(prev) = current.take() {
                return Err(ReportError::Incomplete {
                    kernel: prev.kernel,
                    arch: prev.arch,
                });
            }
            let (kernel, rest) = rest.split_once('\'').ok_or_else(|| bad("kernel name"))?;
            let arch = rest
                .split_once("for '")
                .and_then(|(_, a)| a.split_once('\''))
                .map(|(a, _)| a)
                .ok_or_else(|| bad("architecture"))?;
            current = Some(KernelResources {
                kernel: kernel.to_string(),
                arch: arch.to_string(),
                registers: 0,
                barriers: 0,
                shared_bytes: 0,
                stack_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
            });
        } else if let Some(rest) = line.split_once("Function properties for ").map(|(_, r)| r) {
            properties_of = Some(rest.trim().to_string());
        } else if line.contains("bytes stack frame") {
            let Some(cur) = current.as_mut() else {
                continue;
            };
            if properties_of.as_deref() != Some(cur.kernel.as_str()) {
                continue;
            }
            cur.stack_bytes =
                number_before(line, "bytes stack frame").ok_or_else(|| bad("stack frame"))?;
            cur.spill_store_bytes =
                number_before(line, "bytes spill stores").ok_or_else(|| bad("spill stores"))?;
            cur.spill_load_bytes =
                number_before(line, "bytes spill loads").ok_or_else(|| bad("spill loads"))?;
        } else if line.contains("Used ") && line.contains(" registers") {
            let Some(mut cur) = current.take() else {
                continue;
            };
            let regs = number_after(line, "Used ").ok_or_else(|| bad("registers"))?;
            cur.registers = u32::try_from(regs).map_err(|_| bad("registers"))?;
            if line.contains(" barriers") {
                let b = number_after(line, "used ").ok_or_else(|| bad("barriers"))?;
                cur.barriers = u32::try_from(b).map_err(|_| bad("barriers"))?;
            }
            if line.contains("bytes smem") {
                cur.shared_bytes =
                    number_before(line, "bytes smem").ok_or_else(|| bad("shared memory"))?;
            }
            done.push(cur);
        }
    }
    if let Some(cur) = current {
        return Err(ReportError::Incomplete {
            kernel: cur.kernel,
            arch: cur.arch,
        });
    }
    Ok(done)
}

/// The integer right before `marker` in `line` (`"12 bytes spill stores"` → 12).
fn number_before(line: &str, marker: &str) -> Option<u64> {
    let head = &line[..line.find(marker)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// The integer right after `marker` in `line` (`"Used 10 registers"` → 10).
fn number_after(line: &str, marker: &str) -> Option<u64> {
    let tail = &line[line.find(marker)? + marker.len()..];
    tail.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The parsed report of every prebuilt kernel, as (module name, record) pairs; empty when
/// the crate was built without nvcc.
pub fn all() -> Result<Vec<(&'static str, KernelResources)>, ReportError> {
    let mut rows = Vec::new();
    for module in super::MODULES {
        if let Some(report) = module.ptxas_report {
            rows.extend(parse(report)?.into_iter().map(|r| (module.name, r)));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_shared_memory_spills_and_skips_device_function_properties() {
        let report = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'tile' for 'sm_90'
ptxas info    : Function properties for helper
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for tile
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 384 bytes cmem[0]
";
        let rows = parse(report).expect("parses");
        assert_eq!(
            rows,
            vec![KernelResources {
                kernel: "tile".into(),
                arch: "sm_90".into(),
                registers: 255,
                barriers: 1,
                shared_bytes: 8192,
                stack_bytes: 16,
                spill_store_bytes: 12,
                spill_load_bytes: 8,
            }]
        );
        assert!(rows[0].spills());
    }

    #[test]
    fn an_entry_without_its_register_line_is_an_error() {
        let report = "ptxas info    : Compiling entry function 'k' for 'sm_80'\n";
        assert!(matches!(parse(report), Err(ReportError::Incomplete { .. })));
        let garbled = "ptxas info    : Compiling entry function 'k' for 'sm_80'\nptxas info    : Used many registers\n";
        assert!(matches!(
            parse(garbled),
            Err(ReportError::Malformed { line: 2, .. })
        ));
    }
}
