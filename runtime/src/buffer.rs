//! Typed buffers: device memory on the GPU backend, host memory on the CPU backend.

use std::sync::Arc;

use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::gpu::Device;
use crate::host::{HostData, HostRead, HostWrite};
use crate::host_pool::HostBuffer;

/// A fixed-length array of `T` owned by one [`Runtime`](crate::Runtime).
///
/// Created by [`Runtime::upload`](crate::Runtime::upload) or [`Runtime::alloc`](crate::Runtime::alloc).
/// Device memory stays valid after the runtime is dropped (the buffer keeps the context alive), so
/// results can still be read.
pub struct Buffer<T: Element> {
    len: usize,
    owner: u64,
    storage: Storage<T>,
}

enum Storage<T> {
    /// Shared with the CPU backend's items that use it (crate::host says why).
    Host(Arc<HostData<T>>),
    Device(DeviceAlloc),
}

pub(crate) struct DeviceAlloc {
    device: Arc<Device>,
    ptr: u64,
    owner: Ownership,
}

/// Who frees a device buffer's memory.
enum Ownership {
    /// pptm allocated it and frees it when the buffer drops.
    Pptm,
    /// The application's handle to it (a cudarc slice), dropped with the buffer, which frees it.
    Kept(
        #[allow(dead_code, reason = "held only to be dropped with the buffer")]
        Box<dyn Send + Sync>,
    ),
    /// The application, after the buffer is gone (a raw pointer).
    Application,
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ptr != 0 && matches!(self.owner, Ownership::Pptm) {
            self.device.free(self.ptr);
        }
    }
}

impl<T: Element> std::fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match &self.storage {
            Storage::Host(_) => "host".to_string(),
            Storage::Device(d) => format!(
                "device {:#x}{}",
                d.ptr,
                match d.owner {
                    Ownership::Pptm => "",
                    _ => ", the application's memory",
                }
            ),
        };
        write!(f, "Buffer<{:?}>[{}] ({place})", T::DTYPE, self.len)
    }
}

fn bytes_of_len<T: Element>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or(Error::TooLarge {
            what: "a buffer",
            len,
        })
}

impl<T: Element> Buffer<T> {
    /// Host memory holding `data`, or `len` zeros; allocation failure is an error, not an abort.
    pub(crate) fn host(owner: u64, data: Option<&[T]>, len: usize) -> Result<Self> {
        let bytes = bytes_of_len::<T>(len)?;
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| Error::OutOfMemory { bytes })?;
        match data {
            Some(d) => v.extend_from_slice(d),
            None => v.resize(len, T::zeroed()),
        }
        Ok(Buffer {
            len,
            owner,
            storage: Storage::Host(HostData::new(v)),
        })
    }

    /// Device memory for `len` elements, every 32-bit word set to `fill_word`.
    pub(crate) fn device(
        owner: u64,
        device: &Arc<Device>,
        len: usize,
        fill_word: u32,
    ) -> Result<Self> {
        let bytes = bytes_of_len::<T>(len)?;
        let ptr = if bytes == 0 {
            0
        } else {
            device.alloc(bytes, fill_word)?
        };
        Ok(Buffer {
            len,
            owner,
            storage: Storage::Device(DeviceAlloc {
                device: device.clone(),
                ptr,
                owner: Ownership::Pptm,
            }),
        })
    }

    /// The buffer's length, in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type: `T`'s [`Element::DTYPE`].
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Copies the contents to a new vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.read_into(&mut v)?;
        Ok(v)
    }

    /// Copies the contents into `dst`, which must have the buffer's length.
    pub fn read_into(&self, dst: &mut [T]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::SliceLength {
                buffer: self.len,
                slice: dst.len(),
            });
        }
        match &self.storage {
            Storage::Host(v) => dst.copy_from_slice(v.read().slice()),
            Storage::Device(d) if self.len > 0 => {
                d.device.download(bytemuck::cast_slice_mut(dst), d.ptr)?
            }
            Storage::Device(_) => {}
        }
        Ok(())
    }

    /// Copies `src`, a buffer of the same length, into this one: from this runtime, another GPU
    /// runtime's device or a CPU-backend runtime. Between two buffers of one GPU a copy engine
    /// copies; between two GPUs the copy goes straight from one to the other where they have peer
    /// access (enabled the first time two devices copy, while neither runs a manifold, and by
    /// [`Runtime::every_gpu`](crate::Runtime::every_gpu) for every pair it opens), otherwise the
    /// driver stages it through host memory. So results computed on several GPUs can be gathered
    /// on one without passing through the application's memory.
    pub fn copy_from(&mut self, src: &Buffer<T>) -> Result<()> {
        if src.len != self.len {
            return Err(Error::SliceLength {
                buffer: self.len,
                slice: src.len,
            });
        }
        if self.len == 0 {
            return Ok(());
        }
        let bytes = bytes_of_len::<T>(self.len)?;
        match (&mut self.storage, &src.storage) {
            (Storage::Host(d), Storage::Host(s)) => {
                if !Arc::ptr_eq(d, s) {
                    d.write().slice_mut().copy_from_slice(s.read().slice());
                }
                Ok(())
            }
            (Storage::Device(d), Storage::Host(s)) => d
                .device
                .upload(d.ptr, bytemuck::cast_slice(s.read().slice())),
            (Storage::Host(d), Storage::Device(s)) => s
                .device
                .download(bytemuck::cast_slice_mut(d.write().slice_mut()), s.ptr),
            (Storage::Device(d), Storage::Device(s)) if Arc::ptr_eq(&d.device, &s.device) => {
                d.device.copy_within(d.ptr, s.ptr, bytes)
            }
            (Storage::Device(d), Storage::Device(s)) => d
                .device
                .copy_from_peer(d.ptr, &s.device, s.ptr, bytes)
                .map(|_| ()),
        }
    }

    /// Copies the contents into `dst`, a host buffer of the buffer's length. From a GPU
    /// runtime's pool `dst` is pinned, and the copy goes straight from the device into it (one
    /// transfer, no staging); otherwise this is [`Buffer::read_into`].
    pub fn read_to_host(&self, dst: &mut HostBuffer<T>) -> Result<()> {
        match &self.storage {
            Storage::Device(d) if dst.is_pinned() && self.len == dst.len() && self.len > 0 => d
                .device
                .download_direct(bytemuck::cast_slice_mut(&mut dst[..]), d.ptr),
            _ => self.read_into(dst),
        }
    }

    /// Overwrites the contents with `src`, a host buffer of the buffer's length: straight from
    /// pinned memory to the device on the GPU backend (see [`Buffer::read_to_host`]).
    pub fn write_from_host(&mut self, src: &HostBuffer<T>) -> Result<()> {
        match &self.storage {
            Storage::Device(d) if src.is_pinned() && self.len == src.len() && self.len > 0 => d
                .device
                .upload_direct(d.ptr, bytemuck::cast_slice(&src[..])),
            _ => self.write(src),
        }
    }

    /// Overwrites the contents with `src`, which must have the buffer's length.
    pub fn write(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::SliceLength {
                buffer: self.len,
                slice: src.len(),
            });
        }
        match &mut self.storage {
            Storage::Host(v) => v.write().slice_mut().copy_from_slice(src),
            Storage::Device(d) if self.len > 0 => {
                d.device.upload(d.ptr, bytemuck::cast_slice(src))?
            }
            Storage::Device(_) => {}
        }
        Ok(())
    }

    /// Overwrites the `src.len()` elements from element `offset` with `src`, leaving the rest as
    /// it is: a batch loaded into part of a buffer straight from the caller's array, or a buffer
    /// filled from several arrays without joining them on the host first.
    pub fn write_at(&mut self, offset: usize, src: &[T]) -> Result<()> {
        let end = match offset.checked_add(src.len()) {
            Some(end) if end <= self.len => end,
            _ => {
                return Err(Error::WriteOutOfRange {
                    buffer: self.len,
                    offset,
                    len: src.len(),
                });
            }
        };
        match &mut self.storage {
            Storage::Host(v) => v.write().slice_mut()[offset..end].copy_from_slice(src),
            Storage::Device(d) if !src.is_empty() => {
                let at = d.ptr + (offset * std::mem::size_of::<T>()) as u64;
                d.device.upload(at, bytemuck::cast_slice(src))?
            }
            Storage::Device(_) => {}
        }
        Ok(())
    }

    /// Sets every element to `value` (e.g. NaN, to poison an output before a run).
    pub fn fill(&mut self, value: T) -> Result<()> {
        match &mut self.storage {
            Storage::Host(v) => v.write().slice_mut().fill(value),
            Storage::Device(d) if self.len > 0 => {
                let bytes = bytemuck::bytes_of(&value);
                if bytes.chunks(4).all(|c| c == &bytes[..4]) {
                    let word = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes"));
                    d.device
                        .fill(d.ptr, self.len * std::mem::size_of::<T>(), word)?;
                } else {
                    d.device
                        .upload(d.ptr, bytemuck::cast_slice(&vec![value; self.len]))?;
                }
            }
            Storage::Device(_) => {}
        }
        Ok(())
    }

    /// A buffer over device memory the application owns (checked by the caller): `keep`, if
    /// any, is dropped with the buffer; otherwise nothing is freed.
    pub(crate) fn wrap(
        owner: u64,
        device: &Arc<Device>,
        ptr: u64,
        len: usize,
        keep: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        Buffer {
            len,
            owner,
            storage: Storage::Device(DeviceAlloc {
                device: device.clone(),
                ptr,
                owner: keep.map_or(Ownership::Application, Ownership::Kept),
            }),
        }
    }

    /// The buffer's device address, for the application's own kernels and libraries; `None` for
    /// a buffer of the CPU backend (0 for an empty one). The memory is in the runtime's context
    /// ([`crate::Runtime::cuda_context`]). Reading it while a pptm item writes it, or writing it
    /// while one reads it, is a data race: wait for the item's ticket first.
    pub fn device_address(&self) -> Option<u64> {
        match &self.storage {
            Storage::Device(d) => Some(d.ptr),
            Storage::Host(_) => None,
        }
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    /// Device address (0 for host buffers and empty device buffers).
    pub(crate) fn device_ptr(&self) -> u64 {
        match &self.storage {
            Storage::Device(d) => d.ptr,
            Storage::Host(_) => 0,
        }
    }

    /// Read access to a host buffer's elements, once no item writes them; `None` on a device.
    pub(crate) fn host_read(&self) -> Option<HostRead<T>> {
        match &self.storage {
            Storage::Host(v) => Some(v.read()),
            Storage::Device(_) => None,
        }
    }

    /// Write access to a host buffer's elements, once no item reads or writes them; `None` on a
    /// device. `&mut self`: the buffer's borrow rules come first, the lock covers leaked tickets.
    pub(crate) fn host_write(&mut self) -> Option<HostWrite<T>> {
        match &self.storage {
            Storage::Host(v) => Some(v.write()),
            Storage::Device(_) => None,
        }
    }
}
