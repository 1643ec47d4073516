//! The memory itself: zeroed heap words, or a memfd mapped `MAP_SHARED`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::{ShmError, WORD};

enum Backing {
    Heap(Box<[AtomicU64]>),
    Mapped {
        ptr: NonNull<AtomicU64>,
        words: usize,
        fd: OwnedFd,
    },
}

/// Zero-initialised memory made of `AtomicU64` words, private or shared between processes.
///
/// A shared `Memory` owns its own file descriptor (a memfd, close-on-exec) and its mapping;
/// dropping it unmaps and closes. The contents live as long as any process maps them.
pub struct Memory {
    backing: Backing,
}

// SAFETY: the memory is only ever accessed through `AtomicU64` (see `words`), which is `Sync`;
// the raw pointer is owned by this value (unmapped in `Drop`) and valid on any thread.
unsafe impl Send for Memory {}
// SAFETY: as above: shared references only hand out atomics.
unsafe impl Sync for Memory {}

impl Memory {
    /// `size` bytes (rounded up to whole words) of zeroed private memory.
    pub fn private(size: usize) -> Self {
        let words = size.div_ceil(WORD).max(1);
        Self {
            backing: Backing::Heap((0..words).map(|_| AtomicU64::new(0)).collect()),
        }
    }

    /// `size` bytes (rounded up to whole pages by the kernel) of zeroed memory in a new memfd.
    #[cfg(target_os = "linux")]
    pub fn shared(size: usize) -> Result<Self, ShmError> {
        let words = size.div_ceil(WORD).max(1);
        // SAFETY: the name is a valid NUL-terminated C string; the flags are valid.
        let raw = unsafe { libc::memfd_create(c"servo-shm".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = i64::try_from(words * WORD)
            .map_err(|_| ShmError::Layout(format!("size {size} is too large")))?;
        // SAFETY: `fd` is a valid, owned descriptor; ftruncate only resizes the new file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        Self::map(fd, words)
    }

    /// Maps the memfd (or any shareable file) behind `fd`, which stays owned by the caller.
    #[cfg(target_os = "linux")]
    pub fn attach(fd: RawFd) -> Result<Self, ShmError> {
        // SAFETY: F_DUPFD_CLOEXEC on a caller-provided descriptor; a bad one fails with EBADF.
        let raw = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: fcntl returned a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `stat` is valid writable memory for one `struct stat`.
        if unsafe { libc::fstat(owned.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: fstat returned 0, so it filled the struct.
        let size = unsafe { stat.assume_init() }.st_size;
        let size = usize::try_from(size).unwrap_or(0);
        if size == 0 || size % WORD != 0 {
            return Err(ShmError::Layout(format!(
                "file descriptor {fd} holds {size} bytes, expected a positive multiple of {WORD}"
            )));
        }
        Self::map(owned, size / WORD)
    }

    #[cfg(target_os = "linux")]
    fn map(fd: OwnedFd, words: usize) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared read-write mapping of `words * WORD` bytes of `fd`, which is
        // at least that long; the kernel picks the (page-aligned) address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * WORD,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        let ptr = NonNull::new(ptr.cast::<AtomicU64>())
            .ok_or_else(|| ShmError::Layout("mmap returned a null pointer".to_owned()))?;
        Ok(Self {
            backing: Backing::Mapped { ptr, words, fd },
        })
    }

    /// The file descriptor another process needs to map this memory; `None` if private.
    pub fn fd(&self) -> Option<RawFd> {
        match &self.backing {
            Backing::Heap(_) => None,
            Backing::Mapped { fd, .. } => Some(fd.as_raw_fd()),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.all().len() * WORD
    }

    /// Whether the memory is empty (never: at least one word is allocated).
    pub fn is_empty(&self) -> bool {
        self.all().is_empty()
    }

    pub(crate) fn all(&self) -> &[AtomicU64] {
        match &self.backing {
            Backing::Heap(words) => words,
            // SAFETY: the mapping is `words` words long, page-aligned (so aligned for
            // AtomicU64), lives until `self` is dropped, and is only accessed as atomics.
            Backing::Mapped { ptr, words, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *words)
            },
        }
    }

    /// `count` words starting at byte `offset` (a multiple of 8).
    pub fn words(&self, offset: usize, count: usize) -> Result<&[AtomicU64], ShmError> {
        if offset % WORD != 0 {
            return Err(ShmError::Layout(format!(
                "offset {offset} is not a multiple of {WORD}"
            )));
        }
        let all = self.all();
        let first = offset / WORD;
        first
            .checked_add(count)
            .filter(|end| *end <= all.len())
            .map(|end| &all[first..end])
            .ok_or_else(|| {
                ShmError::Layout(format!(
                    "{} bytes at offset {offset} do not fit in {} bytes of shared memory",
                    count * WORD,
                    self.len()
                ))
            })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Backing::Mapped { ptr, words, .. } = &self.backing {
            // SAFETY: unmaps exactly the mapping `map` created; no reference into it outlives
            // `self` (every view borrows `self`). The fd is closed by `OwnedFd` afterwards.
            unsafe {
                libc::munmap(ptr.as_ptr().cast(), *words * WORD);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Memory {
    /// Shared memory needs Linux (memfd).
    pub fn shared(_size: usize) -> Result<Self, ShmError> {
        Err(ShmError::Layout(
            "shared memory needs Linux (memfd_create)".to_owned(),
        ))
    }

    /// Shared memory needs Linux (memfd).
    pub fn attach(_fd: RawFd) -> Result<Self, ShmError> {
        Err(ShmError::Layout(
            "shared memory needs Linux (memfd_create)".to_owned(),
        ))
    }
}
