mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

// Redline: each module's machine code (a fatbin: the machine code for the
// architecture the PTX targets, and the PTX), empty where the build made none.
mod fatbin {
    include!(concat!(env!("OUT_DIR"), "/fatbin.rs"));
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Id {
    Affine,
    Binary,
    Cast,
    Conv,
    Fill,
    Indexing,
    Quantized,
    Reduce,
    Sort,
    Ternary,
    Unary,
}

pub const ALL_IDS: [Id; 11] = [
    Id::Affine,
    Id::Binary,
    Id::Cast,
    Id::Conv,
    Id::Fill,
    Id::Indexing,
    Id::Quantized,
    Id::Reduce,
    Id::Sort,
    Id::Ternary,
    Id::Unary,
];

/// Redline: whether a value of `REDLINE_CANDLE_PTX` asks candle-core to load
/// the modules' PTX instead of their machine code. Exactly `1` does; anything
/// else (unset, `0`, `true`, ` 1`, bytes that are not UTF-8) leaves the
/// machine code.
pub fn ptx_requested(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

pub struct Module {
    index: usize,
    ptx: &'static str,
    fatbin: &'static [u8],
}

impl Module {
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn ptx(&self) -> &'static str {
        self.ptx
    }

    /// Redline: the module as a fatbin (machine code and PTX), or an empty
    /// slice where the build could not make one.
    pub fn fatbin(&self) -> &'static [u8] {
        self.fatbin
    }
}

const fn module_index(id: Id) -> usize {
    let mut i = 0;
    while i < ALL_IDS.len() {
        if ALL_IDS[i] as u32 == id as u32 {
            return i;
        }
        i += 1;
    }
    panic!("id not found")
}

macro_rules! mdl {
    ($cst:ident, $id:ident) => {
        pub const $cst: Module = Module {
            index: module_index(Id::$id),
            ptx: ptx::$cst,
            fatbin: fatbin::$cst,
        };
    };
}

mdl!(AFFINE, Affine);
mdl!(BINARY, Binary);
mdl!(CAST, Cast);
mdl!(CONV, Conv);
mdl!(FILL, Fill);
mdl!(INDEXING, Indexing);
mdl!(QUANTIZED, Quantized);
mdl!(REDUCE, Reduce);
mdl!(SORT, Sort);
mdl!(TERNARY, Ternary);
mdl!(UNARY, Unary);

pub mod ffi;
