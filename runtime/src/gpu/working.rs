//! Working memory the runtime lends items: a `precision = "bf16x3"` product's blocks write its
//! operands' bf16 halves there before they multiply them (`ChainIr::scratch` gives the layout and
//! the size; kernels/pptm/pattern/mma.cuh, `pptm_matmul_bf16x3`).
//!
//! One allocation list per domain, owned by the runtime rather than by the domain's manifold: a
//! descriptor carries the address, and a kept pipeline's plans (or a pipeline's recorded items)
//! may be dispatched to a manifold relaunched since they were recorded (parking, a re-partition),
//! which must find the memory still there. A domain's manifold runs its items one at a time, and
//! a pipeline orders the plan steps that use the memory as writers of one buffer, so one
//! allocation serves every item of the domain. It only grows: an item in flight may still use a
//! smaller allocation, so each stays until the runtime drops, and each new one at least doubles
//! the last (all of them together under twice the largest).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::Device;
use crate::{Error, Result};

/// The runtime's working memory, by domain key. Dropped after the runtime has shut its manifolds
/// down (a field of the runtime's backend; `Runtime::drop` runs first).
pub(crate) struct WorkingMemory {
    device: Arc<Device>,
    held: Mutex<HashMap<&'static str, Vec<(sys::CUdeviceptr, usize)>>>,
}

impl WorkingMemory {
    pub fn new(device: Arc<Device>) -> Self {
        WorkingMemory {
            device,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The device address of at least `bytes` of working memory for an item of domain `domain`
    /// (256-byte aligned, as every device allocation).
    pub fn lend(&self, domain: &'static str, bytes: u64) -> Result<u64> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let list = held.entry(domain).or_default();
        let last = list.last().map_or(0, |&(_, len)| len);
        if let Some(&(ptr, len)) = list.last()
            && len as u64 >= bytes
        {
            return Ok(ptr);
        }
        let want = usize::try_from(bytes)
            .ok()
            .and_then(|b| {
                b.max(last.saturating_mul(2))
                    .max(1 << 20)
                    .checked_next_multiple_of(1 << 20)
            })
            .ok_or(Error::OutOfMemory { bytes: usize::MAX })?;
        let ptr = self.device.alloc(want, 0)?;
        list.push((ptr, want));
        Ok(ptr)
    }
}

impl Drop for WorkingMemory {
    fn drop(&mut self) {
        let held = self.held.get_mut().unwrap_or_else(|e| e.into_inner());
        // (Device::free leaks instead while a wedged kernel may still write the memory.)
        for &(ptr, _) in held.values().flatten() {
            self.device.free(ptr);
        }
    }
}
