// A fixed tree over the 64 values of `red` (one per thread): the same order on every device
// and for every batch. Call from uniform control flow after each thread wrote red[li].

var<workgroup> red: array<f32, 64>;

fn tree_sum(li: u32) -> f32 {
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if li < stride {
            red[li] = red[li] + red[li + stride];
        }
    }
    workgroupBarrier();
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn tree_max(li: u32) -> f32 {
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if li < stride {
            red[li] = max(red[li], red[li + stride]);
        }
    }
    workgroupBarrier();
    let r = red[0];
    workgroupBarrier();
    return r;
}
