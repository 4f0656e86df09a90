//! Loading the verbs library at run time and resolving its functions by name.
//!
//! Nothing links against `libibverbs` or `librdma`: a binary built with the binding starts
//! on machines without either, and asks for the library only when JACCL is used. This is
//! what MLX does on macOS (`dlopen("librdma.dylib")`), and it is what lets the crate's tests
//! run where there is no RDMA at all.
//!
//! [`LIBRARY_VAR`] names another library to load instead: the tests point it at the project's
//! own verbs provider (`ffi/verbs-provider`), so the unchanged binding drives it exactly as it
//! drives rdma-core. Unset or empty, the platform's library is loaded.

use std::fmt;
use std::sync::Mutex;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use super::sys;

/// The variable that names the verbs library to load instead of the platform's.
pub const LIBRARY_VAR: &str = "NUVEC_DISTRIBUTED_VERBS_LIBRARY";

/// Why the verbs library could not be used.
#[derive(Clone, Debug)]
pub enum LoadError {
    /// No verbs library is known for this operating system.
    Unsupported,
    /// The library could not be opened (the loader's message says why, usually that it is
    /// not installed).
    Open {
        /// The library's name.
        library: &'static str,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The library opened but lacks a function the binding needs.
    Symbol {
        /// The library's name.
        library: &'static str,
        /// The missing function.
        symbol: &'static str,
        /// The dynamic loader's message.
        reason: String,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Unsupported => write!(
                f,
                "no verbs library is known for this operating system (set {LIBRARY_VAR} to \
                 the path of one)"
            ),
            LoadError::Open { library, reason } => {
                write!(f, "cannot load {library}{}: {reason}", origin(library))
            }
            LoadError::Symbol {
                library,
                symbol,
                reason,
            } => write!(f, "{library}{} has no {symbol}: {reason}", origin(library)),
        }
    }
}

/// Where a library's name came from, for messages: nothing for the platform's library, the
/// variable for one it named.
fn origin(library: &str) -> String {
    if Some(library) == sys::LIBRARY {
        String::new()
    } else {
        format!(" (named by {LIBRARY_VAR})")
    }
}

/// The library to load: the one [`LIBRARY_VAR`] names, or the platform's.
fn chosen_library() -> Option<&'static str> {
    match std::env::var_os(LIBRARY_VAR) {
        Some(path) if !path.is_empty() => Some(intern(&path.to_string_lossy())),
        _ => sys::LIBRARY,
    }
}

/// `name` as a `&'static str`, leaked once per distinct name: the loaded library's name is
/// handed out as `&'static str` (`Verbs::library`), and a process names one or two
/// libraries, so the leak is bounded however often the library is loaded.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&known) = names.iter().find(|&&known| known == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}

impl std::error::Error for LoadError {}

/// The library and the functions resolved from it. The function pointers are valid while
/// `_library` is loaded, and it is dropped last (fields drop in declaration order, and it is
/// declared last), so no pointer here outlives it.
pub(crate) struct Api {
    pub(crate) get_device_list: sys::GetDeviceListFn,
    pub(crate) free_device_list: sys::FreeDeviceListFn,
    pub(crate) get_device_name: sys::GetDeviceNameFn,
    pub(crate) open_device: sys::OpenDeviceFn,
    pub(crate) close_device: sys::CloseDeviceFn,
    pub(crate) alloc_pd: sys::AllocPdFn,
    pub(crate) dealloc_pd: sys::DeallocPdFn,
    pub(crate) create_cq: sys::CreateCqFn,
    pub(crate) destroy_cq: sys::DestroyCqFn,
    pub(crate) create_qp: sys::CreateQpFn,
    pub(crate) destroy_qp: sys::DestroyQpFn,
    pub(crate) modify_qp: sys::ModifyQpFn,
    pub(crate) query_device: sys::QueryDeviceFn,
    pub(crate) query_port: sys::QueryPortFn,
    pub(crate) query_gid: sys::QueryGidFn,
    pub(crate) reg_mr: sys::RegMrFn,
    pub(crate) dereg_mr: sys::DeregMrFn,
    /// The completion-channel functions, if the library exports all four (MLX uses none).
    pub(crate) channels: Option<ChannelApi>,
    pub(crate) library: &'static str,
    _library: Library,
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// Opens the verbs library ([`LIBRARY_VAR`]'s, else the platform's) and resolves the 16
    /// functions MLX's JACCL uses, and `ibv_query_device` (for the number of ports, which
    /// llama.cpp's Apple transport reads the same way).
    pub(crate) fn load() -> Result<Api, LoadError> {
        let library = chosen_library().ok_or(LoadError::Unsupported)?;
        // SAFETY: opening a shared library runs its initialisers. The verbs libraries
        // (rdma-core's libibverbs, Apple's librdma) are system libraries whose initialisers
        // only set up their own state; loading them is what every verbs program does at
        // start-up. A library named by LIBRARY_VAR is one the user chose to run as the verbs
        // library (the project's test provider has no initialisers). RTLD_NOW resolves all
        // their symbols here rather than on first call.
        let opened = unsafe { Library::open(Some(library), RTLD_NOW | RTLD_LOCAL) };
        let lib = opened.map_err(|e| LoadError::Open {
            library,
            reason: format!("{e:?}"),
        })?;
        let l = (&lib, library);
        // SAFETY (each `symbol` call below): the type asked for is the function's C signature
        // from verbs.h, transcribed in `sys` (and compared with the header, argument by
        // argument, by reading; the layout test covers the structs the arguments point to).
        Ok(Api {
            // SAFETY: see above; `ibv_device **ibv_get_device_list(int *num_devices)`.
            get_device_list: unsafe { symbol(l, b"ibv_get_device_list\0") }?,
            // SAFETY: see above; `void ibv_free_device_list(struct ibv_device **list)`.
            free_device_list: unsafe { symbol(l, b"ibv_free_device_list\0") }?,
            // SAFETY: see above; `const char *ibv_get_device_name(struct ibv_device *)`.
            get_device_name: unsafe { symbol(l, b"ibv_get_device_name\0") }?,
            // SAFETY: see above; `struct ibv_context *ibv_open_device(struct ibv_device *)`.
            open_device: unsafe { symbol(l, b"ibv_open_device\0") }?,
            // SAFETY: see above; `int ibv_close_device(struct ibv_context *)`.
            close_device: unsafe { symbol(l, b"ibv_close_device\0") }?,
            // SAFETY: see above; `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`.
            alloc_pd: unsafe { symbol(l, b"ibv_alloc_pd\0") }?,
            // SAFETY: see above; `int ibv_dealloc_pd(struct ibv_pd *)`.
            dealloc_pd: unsafe { symbol(l, b"ibv_dealloc_pd\0") }?,
            // SAFETY: see above; `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe,
            // void *cq_context, struct ibv_comp_channel *, int comp_vector)`.
            create_cq: unsafe { symbol(l, b"ibv_create_cq\0") }?,
            // SAFETY: see above; `int ibv_destroy_cq(struct ibv_cq *)`.
            destroy_cq: unsafe { symbol(l, b"ibv_destroy_cq\0") }?,
            // SAFETY: see above; `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct
            // ibv_qp_init_attr *)`.
            create_qp: unsafe { symbol(l, b"ibv_create_qp\0") }?,
            // SAFETY: see above; `int ibv_destroy_qp(struct ibv_qp *)`.
            destroy_qp: unsafe { symbol(l, b"ibv_destroy_qp\0") }?,
            // SAFETY: see above; `int ibv_modify_qp(struct ibv_qp *, struct ibv_qp_attr *,
            // int attr_mask)`.
            modify_qp: unsafe { symbol(l, b"ibv_modify_qp\0") }?,
            // SAFETY: see above; `int ibv_query_device(struct ibv_context *, struct
            // ibv_device_attr *)`.
            query_device: unsafe { symbol(l, b"ibv_query_device\0") }?,
            // SAFETY: see above; `int ibv_query_port(struct ibv_context *, uint8_t port_num,
            // struct ibv_port_attr *)` (the exported, possibly shorter, form: see `sys`).
            query_port: unsafe { symbol(l, b"ibv_query_port\0") }?,
            // SAFETY: see above; `int ibv_query_gid(struct ibv_context *, uint8_t port_num,
            // int index, union ibv_gid *)`.
            query_gid: unsafe { symbol(l, b"ibv_query_gid\0") }?,
            // SAFETY: see above; `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr,
            // size_t length, int access)`.
            reg_mr: unsafe { symbol(l, b"ibv_reg_mr\0") }?,
            // SAFETY: see above; `int ibv_dereg_mr(struct ibv_mr *)`.
            dereg_mr: unsafe { symbol(l, b"ibv_dereg_mr\0") }?,
            channels: ChannelApi::load(l),
            library,
            _library: lib,
        })
    }
}

/// The functions of completion channels: optional, because MLX's JACCL does not use them
/// and a library may lack them (whether Apple's `librdma` exports them is not known here;
/// the binding asks the loader at run time rather than assuming).
#[derive(Clone, Copy)]
pub(crate) struct ChannelApi {
    pub(crate) create: sys::CreateCompChannelFn,
    pub(crate) destroy: sys::DestroyCompChannelFn,
    pub(crate) get_event: sys::GetCqEventFn,
    pub(crate) ack_events: sys::AckCqEventsFn,
}

impl ChannelApi {
    /// The four functions, or `None` if any is missing.
    fn load(l: (&Library, &'static str)) -> Option<ChannelApi> {
        // SAFETY (each `symbol` call below): as in `Api::load`, the types are verbs.h's
        // signatures, transcribed in `sys`.
        Some(ChannelApi {
            // SAFETY: see above; `struct ibv_comp_channel *ibv_create_comp_channel(struct
            // ibv_context *)`.
            create: unsafe { symbol(l, b"ibv_create_comp_channel\0") }.ok()?,
            // SAFETY: see above; `int ibv_destroy_comp_channel(struct ibv_comp_channel *)`.
            destroy: unsafe { symbol(l, b"ibv_destroy_comp_channel\0") }.ok()?,
            // SAFETY: see above; `int ibv_get_cq_event(struct ibv_comp_channel *, struct
            // ibv_cq **, void **cq_context)`.
            get_event: unsafe { symbol(l, b"ibv_get_cq_event\0") }.ok()?,
            // SAFETY: see above; `void ibv_ack_cq_events(struct ibv_cq *, unsigned int)`.
            ack_events: unsafe { symbol(l, b"ibv_ack_cq_events\0") }.ok()?,
        })
    }
}

/// Resolves `name` (NUL-terminated) in the library as a value of type `T`.
///
/// # Safety
///
/// `T` must be the exact type of the symbol: for a function, an `unsafe extern "C" fn`
/// pointer with the C declaration's argument and return types. The value returned is only
/// valid while the library stays loaded.
unsafe fn symbol<T: Copy>(
    (lib, library): (&Library, &'static str),
    name: &'static [u8],
) -> Result<T, LoadError> {
    // SAFETY: the caller guarantees that `T` is the symbol's type; `name` is NUL-terminated.
    let found = unsafe { lib.get::<T>(name) };
    match found {
        Ok(symbol) => Ok(*symbol),
        Err(e) => Err(LoadError::Symbol {
            library,
            symbol: symbol_name(name),
            reason: format!("{e:?}"),
        }),
    }
}

/// The symbol's name without its terminating NUL, for messages.
fn symbol_name(name: &'static [u8]) -> &'static str {
    let name = name.strip_suffix(b"\0").unwrap_or(name);
    std::str::from_utf8(name).unwrap_or("<non-UTF-8 symbol>")
}
