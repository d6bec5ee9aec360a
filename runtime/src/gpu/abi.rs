//! The host half of the ABI: the bindgen output of kernels/pptm/abi.h plus the slot encoding.

#[rustfmt::skip]
#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]
#[path = "abi_generated.rs"]
mod abi_generated;
pub(crate) use abi_generated::*;

// The spec crate (used by the derive macro, which cannot see this header) mirrors a few constants;
// they must agree.
const _: () = {
    assert!(PPTM_DESC_ARGS as usize == pptm_spec::DESC_ARGS);
    assert!(PPTM_OP_FIRST_VARIANT == pptm_spec::FIRST_VARIANT_OPCODE);
    assert!(std::mem::size_of::<pptm_desc>() == 4 * PPTM_SQ_SLOT_WORDS as usize);
    assert!(std::mem::size_of::<pptm_cq_entry>() == 64);
};

/// The tag of item `seq` in a ring of `1 << log2` slots: never 0, different on every lap.
pub(crate) fn sq_tag(seq: u64, log2: u32) -> u32 {
    ((seq >> log2) % 0xFFFF_FFFF) as u32 + 1
}

/// The 32 payload words of a descriptor, in the order of its bytes.
pub(crate) fn payload(desc: &pptm_desc) -> [u32; PPTM_SQ_SLOT_WORDS as usize] {
    let mut w = [0u32; PPTM_SQ_SLOT_WORDS as usize];
    w[0] = desc.opcode;
    w[1] = desc.blocks;
    for (i, a) in desc.args.iter().enumerate() {
        w[2 + 2 * i] = *a as u32;
        w[3 + 2 * i] = (*a >> 32) as u32;
    }
    w
}

/// Decodes what `payload` produced (the device does the same in manifold.cuh).
#[cfg(test)]
pub(crate) fn from_payload(w: &[u32; PPTM_SQ_SLOT_WORDS as usize]) -> pptm_desc {
    let mut d = pptm_desc {
        opcode: w[0],
        blocks: w[1],
        ..Default::default()
    };
    for i in 0..d.args.len() {
        d.args[i] = u64::from(w[2 + 2 * i]) | (u64::from(w[3 + 2 * i]) << 32);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_the_c_layout() {
        let mut d = pptm_desc {
            opcode: 0xdead_beef,
            blocks: 7,
            ..Default::default()
        };
        for (i, a) in d.args.iter_mut().enumerate() {
            *a = 0x0102_0304_0506_0708u64.wrapping_mul(i as u64 + 1);
        }
        let w = payload(&d);
        // Same bytes as the struct in memory (little-endian), which is what the device reads.
        // SAFETY: pptm_desc is repr(C), 128 bytes, no padding (checked by the layout asserts).
        let raw: [u32; 32] = unsafe { std::mem::transmute(d) };
        assert_eq!(w, raw);
        assert_eq!(from_payload(&w).args, d.args);
    }

    #[test]
    fn tags_are_nonzero_and_change_every_lap() {
        let log2 = 8;
        assert_eq!(sq_tag(0, log2), 1);
        assert_eq!(sq_tag(255, log2), 1);
        assert_eq!(sq_tag(256, log2), 2);
        let wrap = 0xFFFF_FFFFu64 << log2;
        assert_eq!(sq_tag(wrap - 1, log2), 0xFFFF_FFFF);
        assert_eq!(sq_tag(wrap, log2), 1);
        for lap in [0u64, 1, 1000, 0xFFFF_FFFE, 0xFFFF_FFFF, 1 << 40] {
            let s = lap << log2;
            assert_ne!(sq_tag(s, log2), 0);
            assert_ne!(sq_tag(s, log2), sq_tag(s + 256, log2));
        }
    }
}
