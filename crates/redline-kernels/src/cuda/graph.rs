//! What a captured CUDA graph holds: its nodes and their kinds.

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};

/// `graph`'s node count and each node's kind as the driver numbers it
/// (`CUgraphNodeType`: 0 kernel, 1 memcpy, 2 memset, 10 allocation, 11 free,
/// ...), read as numbers so that a kind newer than this build is no Rust
/// enum value; `None` if the driver would not say how many. The kinds may be
/// fewer than the count (a node whose kind the driver would not give).
pub fn graph_node_kinds(graph: &CudaGraph) -> Option<(usize, Vec<u32>)> {
    let mut n = 0usize;
    // SAFETY: a null node array asks only for the count; the graph is live.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    let mut got = n;
    // SAFETY: `nodes` has room for the `got` = n nodes the driver writes.
    let r = unsafe { sys::cuGraphGetNodes(graph.cu_graph(), nodes.as_mut_ptr(), &mut got) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Some((n, Vec::new()));
    }
    let kinds = nodes
        .iter()
        .take(got.min(n))
        .filter_map(|&node| {
            let mut raw = u32::MAX;
            // SAFETY: a node of the live graph; the driver writes one 32-bit
            // enum value into `raw`.
            let r = unsafe {
                sys::cuGraphNodeGetType(node, (&mut raw as *mut u32).cast::<sys::CUgraphNodeType>())
            };
            (r == sys::CUresult::CUDA_SUCCESS).then_some(raw)
        })
        .collect();
    Some((n, kinds))
}
