//! The only module that calls libfabric: one reliable-datagram endpoint (FI_EP_RDM) with its
//! fabric, domain, address vector and tagged completion queue, and memory registrations.
//!
//! Why one object for all of them: libfabric's objects must be closed in reverse order of their
//! creation (endpoint, then address vector and completion queue, then domain, then fabric), and
//! an [`Endpoint`] owning all of them closes them in that order in its `Drop`.
//!
//! Threading: the domain is opened `FI_THREAD_SAFE`, but ferromq still calls the data path
//! (post, poll) from one thread only, the engine's; other threads only call [`Endpoint::signal`]
//! to wake it.

use std::ffi::{CStr, CString, c_void};
use std::ptr;

use ferromq_ofi_sys as sys;

/// A libfabric call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call} failed: {text} (libfabric error {code})")]
pub struct FabricError {
    /// The libfabric function.
    pub call: &'static str,
    /// libfabric's (positive) error number.
    pub code: i32,
    /// `fi_strerror`'s text, or the provider's.
    pub text: String,
}

impl FabricError {
    fn from_code(call: &'static str, code: i64) -> FabricError {
        let code = code.unsigned_abs() as i32;
        // SAFETY: fi_strerror returns a pointer to a static string for any number.
        let text = unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
            .to_string_lossy()
            .into_owned();
        FabricError { call, code, text }
    }
}

fn check(call: &'static str, rc: i64) -> Result<(), FabricError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FabricError::from_code(call, rc))
    }
}

/// The libfabric API version ferromq asks for (Debian 12 ships 1.17).
const API_VERSION: u32 = sys::make_version(1, 17);

/// A failed operation read from the queue.
#[derive(Debug, Clone)]
pub(crate) struct FailedCompletion {
    /// The context pointer the operation was posted with.
    pub(crate) context: usize,
    /// Why, in the provider's words.
    pub(crate) error: FabricError,
}

/// What a poll of the completion queue found.
pub(crate) enum Polled {
    /// `n` completions were written to the buffer.
    Completed(usize),
    /// One operation failed.
    Failed(FailedCompletion),
    /// Nothing completed (or the wait timed out or was signalled).
    Nothing,
}

/// Which way a posted operation moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From our buffer to the peer.
    Send,
    /// From the peer into our buffer.
    Receive,
}

/// Whether a post was accepted.
pub(crate) enum Posted {
    /// The operation is in flight; its completion will carry the context.
    Accepted,
    /// The provider's queues are full: make progress (poll) and post again.
    Again,
}

/// The fields of a tagged completion entry, as libfabric writes them.
pub(crate) type CompletionEntry = sys::fi_cq_tagged_entry;

/// An RDM endpoint and everything it needs, closed in the right order on drop.
pub(crate) struct Endpoint {
    info: *mut sys::fi_info,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    ep: *mut sys::fid_ep,
    /// The provider actually used (`tcp;ofi_rxm`, ...).
    pub(crate) provider: String,
    /// The largest message the endpoint sends in one operation.
    pub(crate) max_msg_size: usize,
    /// Whether local buffers must be registered before use (FI_MR_LOCAL: verbs).
    pub(crate) mr_local: bool,
    /// Whether a wait on the completion queue is possible (else the engine polls).
    pub(crate) can_wait: bool,
}

// SAFETY: libfabric objects are plain heap objects usable from any thread; the domain is opened
// FI_THREAD_SAFE, so even concurrent calls would be serialised by the provider.
unsafe impl Send for Endpoint {}
// SAFETY: as above; shared access is limited to `signal`, which libfabric allows from any thread.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Opens an RDM endpoint of `provider` (`tcp;ofi_rxm`, `verbs;ofi_rxm`), listening on `node`
    /// (an interface address; `None` lets the provider choose).
    pub(crate) fn open(provider: &str, node: Option<&str>) -> Result<Endpoint, FabricError> {
        let provider_c = CString::new(provider).map_err(|_| FabricError {
            call: "fi_getinfo",
            code: 22,
            text: format!("provider name {provider:?} contains a NUL byte"),
        })?;
        let node_c = node
            .map(|node| {
                CString::new(node).map_err(|_| FabricError {
                    call: "fi_getinfo",
                    code: 22,
                    text: format!("node {node:?} contains a NUL byte"),
                })
            })
            .transpose()?;
        let mut endpoint = Endpoint {
            info: ptr::null_mut(),
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: ptr::null_mut(),
            provider: provider.to_owned(),
            max_msg_size: 0,
            mr_local: false,
            can_wait: true,
        };
        // SAFETY: hints come from fi_allocinfo and are filled only with values libfabric expects
        // (the provider name is strdup'ed so that fi_freeinfo may free it); every object is
        // stored in `endpoint` as soon as it exists, so its Drop closes whatever was opened if a
        // later step fails.
        unsafe {
            let hints = sys::ferromq_fi_allocinfo();
            if hints.is_null() {
                return Err(FabricError::from_code("fi_allocinfo", 12));
            }
            (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
            (*hints).caps =
                u64::from(sys::FI_TAGGED) | u64::from(sys::FI_SEND) | u64::from(sys::FI_RECV);
            (*hints).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*hints).domain_attr).threading = sys::fi_threading_FI_THREAD_SAFE;
            (*(*hints).domain_attr).mr_mode = (sys::FI_MR_LOCAL
                | sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_PROV_KEY) as i32;
            (*(*hints).fabric_attr).prov_name = strdup(provider_c.as_ptr());
            let mut info = ptr::null_mut();
            let rc = sys::fi_getinfo(
                API_VERSION,
                node_c.as_ref().map_or(ptr::null(), |node| node.as_ptr()),
                ptr::null(),
                if node_c.is_some() { sys::FI_SOURCE } else { 0 },
                hints,
                &mut info,
            );
            sys::fi_freeinfo(hints);
            check("fi_getinfo", i64::from(rc))?;
            endpoint.info = info;
            let info = &*info;
            endpoint.max_msg_size = (*info.ep_attr).max_msg_size;
            endpoint.mr_local = (*info.domain_attr).mr_mode & sys::FI_MR_LOCAL as i32 != 0;
            if !(*info.fabric_attr).prov_name.is_null() {
                endpoint.provider = CStr::from_ptr((*info.fabric_attr).prov_name)
                    .to_string_lossy()
                    .into_owned();
            }

            check(
                "fi_fabric",
                i64::from(sys::ferromq_fi_fabric(
                    info.fabric_attr,
                    &mut endpoint.fabric,
                    ptr::null_mut(),
                )),
            )?;
            check(
                "fi_domain",
                i64::from(sys::ferromq_fi_domain(
                    endpoint.fabric,
                    endpoint.info,
                    &mut endpoint.domain,
                    ptr::null_mut(),
                )),
            )?;
            let mut cq_attr = sys::fi_cq_attr {
                format: sys::fi_cq_format_FI_CQ_FORMAT_TAGGED,
                wait_obj: sys::fi_wait_obj_FI_WAIT_UNSPEC,
                size: 4096,
                ..Default::default()
            };
            let rc = sys::ferromq_fi_cq_open(
                endpoint.domain,
                &mut cq_attr,
                &mut endpoint.cq,
                ptr::null_mut(),
            );
            if rc != 0 {
                // A provider without wait objects: the engine polls instead of sleeping.
                endpoint.can_wait = false;
                cq_attr.wait_obj = sys::fi_wait_obj_FI_WAIT_NONE;
                check(
                    "fi_cq_open",
                    i64::from(sys::ferromq_fi_cq_open(
                        endpoint.domain,
                        &mut cq_attr,
                        &mut endpoint.cq,
                        ptr::null_mut(),
                    )),
                )?;
            }
            let mut av_attr = sys::fi_av_attr {
                type_: sys::fi_av_type_FI_AV_MAP,
                ..Default::default()
            };
            check(
                "fi_av_open",
                i64::from(sys::ferromq_fi_av_open(
                    endpoint.domain,
                    &mut av_attr,
                    &mut endpoint.av,
                    ptr::null_mut(),
                )),
            )?;
            check(
                "fi_endpoint",
                i64::from(sys::ferromq_fi_endpoint(
                    endpoint.domain,
                    endpoint.info,
                    &mut endpoint.ep,
                    ptr::null_mut(),
                )),
            )?;
            check(
                "fi_ep_bind(av)",
                i64::from(sys::ferromq_fi_ep_bind(
                    endpoint.ep,
                    &mut (*endpoint.av).fid,
                    0,
                )),
            )?;
            check(
                "fi_ep_bind(cq)",
                i64::from(sys::ferromq_fi_ep_bind(
                    endpoint.ep,
                    &mut (*endpoint.cq).fid,
                    u64::from(sys::FI_TRANSMIT) | u64::from(sys::FI_RECV),
                )),
            )?;
            check("fi_enable", i64::from(sys::ferromq_fi_enable(endpoint.ep)))?;
        }
        Ok(endpoint)
    }

    /// The endpoint's address in the provider's format, for the peer's address vector.
    pub(crate) fn name(&self) -> Result<Vec<u8>, FabricError> {
        let mut buffer = vec![0u8; 256];
        let mut len = buffer.len();
        // SAFETY: `buffer` has `len` writable bytes; the endpoint is open.
        let rc = unsafe {
            sys::ferromq_fi_getname(&mut (*self.ep).fid, buffer.as_mut_ptr().cast(), &mut len)
        };
        check("fi_getname", i64::from(rc))?;
        buffer.truncate(len);
        Ok(buffer)
    }

    /// A printable form of an address (`fi_sockaddr_in://127.0.0.1:4711`).
    pub(crate) fn address_text(&self, address: &[u8]) -> String {
        let mut buffer = vec![0u8; 128];
        let mut len = buffer.len();
        // SAFETY: `address` came from a peer's fi_getname in the same format; fi_av_straddr
        // writes at most `len` bytes, NUL-terminated.
        unsafe {
            sys::ferromq_fi_av_straddr(
                self.av,
                address.as_ptr().cast(),
                buffer.as_mut_ptr().cast(),
                &mut len,
            );
        }
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    }

    /// Adds a peer's address to the address vector; returns its `fi_addr_t`.
    pub(crate) fn insert_peer(&self, address: &[u8]) -> Result<u64, FabricError> {
        if address.len() < 2 {
            return Err(FabricError {
                call: "fi_av_insert",
                code: 22,
                text: format!("peer address of {} bytes", address.len()),
            });
        }
        let mut fi_addr: u64 = 0;
        // SAFETY: one address of the provider's format, as the peer's fi_getname gave it (its
        // length was checked by the provider there); `fi_addr` receives one value.
        let inserted = unsafe {
            sys::ferromq_fi_av_insert(
                self.av,
                address.as_ptr().cast(),
                1,
                &mut fi_addr,
                0,
                ptr::null_mut(),
            )
        };
        if inserted != 1 {
            return Err(FabricError::from_code(
                "fi_av_insert",
                i64::from(inserted.min(0)).min(-22),
            ));
        }
        Ok(fi_addr)
    }

    /// Removes a peer from the address vector (its connection is closed).
    pub(crate) fn remove_peer(&self, mut fi_addr: u64) {
        // SAFETY: `fi_addr` came from insert_peer on this address vector.
        let rc = unsafe { sys::ferromq_fi_av_remove(self.av, &mut fi_addr, 1, 0) };
        if rc != 0 {
            tracing::debug!(rc, "fi_av_remove failed");
        }
    }

    /// Posts a tagged send of the bytes of `buffer` to `peer`, or a tagged receive of up to
    /// its length into it from `peer`.
    ///
    /// # Safety
    /// `buffer` must stay valid until the operation's completion (or cancellation)
    /// has been read, unchanged for a send and touched by nobody else for a receive; `context`
    /// must live as long.
    pub(crate) unsafe fn post(
        &self,
        direction: Direction,
        buffer: *mut [u8],
        desc: *mut c_void,
        peer: u64,
        tag: u64,
        context: *mut c_void,
    ) -> Result<Posted, FabricError> {
        let len = buffer.len();
        let (call, rc) = match direction {
            // SAFETY: guaranteed by the caller (see above).
            Direction::Send => ("fi_tsend", unsafe {
                sys::ferromq_fi_tsend(self.ep, buffer.cast(), len, desc, peer, tag, context)
            }),
            // SAFETY: guaranteed by the caller (see above).
            Direction::Receive => ("fi_trecv", unsafe {
                sys::ferromq_fi_trecv(self.ep, buffer.cast(), len, desc, peer, tag, 0, context)
            }),
        };
        posted(call, rc as i64)
    }

    /// Asks the provider to cancel the operation posted with `context`; its completion then
    /// arrives as a failure (FI_ECANCELED) or, if it was already done, as a success.
    pub(crate) fn cancel(&self, context: usize) {
        // SAFETY: fi_cancel only looks the context up among the endpoint's pending operations.
        unsafe {
            sys::ferromq_fi_cancel(&mut (*self.ep).fid, context as *mut c_void);
        }
    }

    /// Reads completions without waiting.
    pub(crate) fn poll(&self, entries: &mut [CompletionEntry]) -> Result<Polled, FabricError> {
        // SAFETY: `entries` has room for entries.len() tagged entries, the queue's format.
        let rc =
            unsafe { sys::ferromq_fi_cq_read(self.cq, entries.as_mut_ptr().cast(), entries.len()) };
        self.polled(rc as i64)
    }

    /// Reads completions, waiting up to `timeout_ms` for one (or for [`Endpoint::signal`]).
    pub(crate) fn wait(
        &self,
        entries: &mut [CompletionEntry],
        timeout_ms: i32,
    ) -> Result<Polled, FabricError> {
        if !self.can_wait {
            std::thread::sleep(std::time::Duration::from_micros(50));
            return self.poll(entries);
        }
        // SAFETY: as in `poll`; no wait condition is used.
        let rc = unsafe {
            sys::ferromq_fi_cq_sread(
                self.cq,
                entries.as_mut_ptr().cast(),
                entries.len(),
                ptr::null(),
                timeout_ms,
            )
        };
        self.polled(rc as i64)
    }

    /// Wakes a thread blocked in [`Endpoint::wait`].
    pub(crate) fn signal(&self) {
        if self.can_wait {
            // SAFETY: the queue is open; signalling is allowed from any thread.
            unsafe {
                sys::ferromq_fi_cq_signal(self.cq);
            }
        }
    }

    fn polled(&self, rc: i64) -> Result<Polled, FabricError> {
        if rc > 0 {
            return Ok(Polled::Completed(rc as usize));
        }
        let code = -rc;
        if rc == 0 || code == i64::from(sys::FI_EAGAIN) || code == i64::from(sys::FI_ETIMEDOUT) {
            return Ok(Polled::Nothing);
        }
        if code != i64::from(sys::FI_EAVAIL) {
            return Err(FabricError::from_code("fi_cq_read", rc));
        }
        let mut entry = sys::fi_cq_err_entry::default();
        // SAFETY: one error entry is available; `entry` is a zeroed fi_cq_err_entry (err_data
        // null: the provider keeps its own buffer, valid until the next read).
        let rc = unsafe { sys::ferromq_fi_cq_readerr(self.cq, &mut entry, 0) };
        if rc < 0 {
            if -rc as i64 == i64::from(sys::FI_EAGAIN) {
                return Ok(Polled::Nothing);
            }
            return Err(FabricError::from_code("fi_cq_readerr", rc as i64));
        }
        let mut text = vec![0u8; 256];
        // SAFETY: fi_cq_strerror writes at most text.len() bytes and returns a NUL-terminated
        // string (either `text` or a static one); err_data is valid until the next read.
        let described = unsafe {
            let returned = sys::ferromq_fi_cq_strerror(
                self.cq,
                entry.prov_errno,
                entry.err_data,
                text.as_mut_ptr().cast(),
                text.len(),
            );
            if returned.is_null() {
                String::new()
            } else {
                CStr::from_ptr(returned).to_string_lossy().into_owned()
            }
        };
        let mut error = FabricError::from_code("completion", i64::from(entry.err));
        if !described.is_empty() && described != error.text {
            error.text = format!("{} ({described})", error.text);
        }
        Ok(Polled::Failed(FailedCompletion {
            context: entry.op_context as usize,
            error,
        }))
    }

    /// Registers `len` bytes at `base` for sends and receives.
    ///
    /// # Safety
    /// The memory must stay mapped until the returned region is dropped.
    pub(crate) unsafe fn register(
        &self,
        base: *const u8,
        len: usize,
    ) -> Result<MemoryRegion, FabricError> {
        let mut mr = ptr::null_mut();
        // SAFETY: guaranteed by the caller; the domain is open.
        let rc = unsafe {
            sys::ferromq_fi_mr_reg(
                self.domain,
                base.cast(),
                len,
                u64::from(sys::FI_SEND) | u64::from(sys::FI_RECV),
                0,
                0,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", i64::from(rc))?;
        // SAFETY: `mr` was just registered.
        let desc = unsafe { sys::ferromq_fi_mr_desc(mr) };
        Ok(MemoryRegion { mr, desc })
    }
}

fn posted(call: &'static str, rc: i64) -> Result<Posted, FabricError> {
    if rc == 0 {
        Ok(Posted::Accepted)
    } else if -rc == i64::from(sys::FI_EAGAIN) {
        Ok(Posted::Again)
    } else {
        Err(FabricError::from_code(call, rc))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: each object is closed once, children before parents, and only if it was opened.
        unsafe {
            for fid in [
                self.ep.cast::<sys::fid>(),
                self.av.cast(),
                self.cq.cast(),
                self.domain.cast(),
                self.fabric.cast(),
            ] {
                if !fid.is_null() {
                    sys::ferromq_fi_close(fid);
                }
            }
            if !self.info.is_null() {
                sys::fi_freeinfo(self.info);
            }
        }
    }
}

/// A registered memory range; deregistered on drop.
pub(crate) struct MemoryRegion {
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
}

// SAFETY: a registration is a heap object of the provider, usable from any thread.
unsafe impl Send for MemoryRegion {}

impl MemoryRegion {
    /// The local descriptor to pass with operations on this memory.
    pub(crate) fn desc(&self) -> *mut c_void {
        self.desc
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: the region was registered and is closed once. Every MemoryRegion is dropped
        // before the Endpoint whose domain made it (the engine owns both, regions first).
        unsafe {
            sys::ferromq_fi_close(self.mr.cast());
        }
    }
}

unsafe extern "C" {
    fn strdup(text: *const std::ffi::c_char) -> *mut std::ffi::c_char;
}
