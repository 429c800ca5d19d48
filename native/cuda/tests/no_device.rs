//! On a machine without the NVIDIA driver (CI) the backend refuses to
//! open in one line that says what is missing and what to run instead;
//! where a driver is present this prints why it checks nothing.

use hearth_cuda::device::{device_count, driver_present};
use hearth_cuda::CudaBackend;

#[test]
fn without_a_driver_the_backend_says_so_in_one_line() {
    if driver_present() {
        eprintln!(
            "no-driver test not run: this machine has the NVIDIA driver ({} devices)",
            device_count()
        );
        return;
    }
    assert_eq!(device_count(), 0);
    let err = match CudaBackend::new(0) {
        Ok(_) => panic!("a backend opened without a driver"),
        Err(e) => e.to_string(),
    };
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains("libcuda"), "names what is missing: {err}");
    assert!(
        err.contains("--backend cpu"),
        "says what to run instead: {err}"
    );
}
