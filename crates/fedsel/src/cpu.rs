//! The vector instruction set of this CPU, probed once at run time for every
//! hand-written kernel: the CNNs' glue loops, the char-LSTM's panel products and DivFL's
//! distances. One binary serves every x86-64 CPU, built for its baseline (SSE2); each
//! kernel keeps a version per [`Isa`] and runs the widest this CPU has. The versions give
//! the same bits (each module tests its own); only `gemm`'s kernels, which choose their
//! blocking by instruction set, round differently from one CPU kind to another.

/// An instruction set the kernels are compiled for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64; anything on another architecture).
    Baseline,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 F/BW/DQ/VL, with AVX2 and FMA.
    Avx512,
}

impl Isa {
    /// The name `fedsel bench` prints.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512f",
            Isa::Avx2 => "avx2+fma",
            Isa::Baseline => "baseline",
        }
    }
}

/// The widest [`Isa`] this CPU runs (std caches the CPUID probe).
pub fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                return Isa::Avx512;
            }
            return Isa::Avx2;
        }
    }
    Isa::Baseline
}

/// Runs the function given (its name is for the reader) compiled for `isa`, one this CPU
/// runs ([`isa`]): the one source of every kernel's per-[`Isa`] copies, which the
/// compiler vectorises for each instruction set. Additions, multiplications and
/// comparisons round alike in every instruction set and Rust never fuses a multiply with
/// an add unasked, so each copy gives the same bits.
macro_rules! on_isa {
    ($isa:expr, fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {{
        #[inline(always)]
        fn imp($($arg: $ty),*) $body
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        fn avx512($($arg: $ty),*) {
            imp($($arg),*)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        fn avx2($($arg: $ty),*) {
            imp($($arg),*)
        }
        match $isa {
            // SAFETY: `isa` is one this CPU runs.
            #[cfg(target_arch = "x86_64")]
            $crate::cpu::Isa::Avx512 => unsafe { avx512($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            $crate::cpu::Isa::Avx2 => unsafe { avx2($($arg),*) },
            _ => imp($($arg),*),
        }
    }};
}
pub(crate) use on_isa;
