//! postern's own resources running out (descriptors, memory) at a step any transport takes:
//! named as postern's failure, never as the destination's.

/// A connect error that is postern's own resource running out, described for the evidence.
pub fn postern_resource(e: &std::io::Error) -> Option<String> {
    use rustix::io::Errno;
    let what = match Errno::from_io_error(e)? {
        Errno::MFILE => "postern has no file descriptor left (EMFILE)",
        Errno::NFILE => "the system has no file descriptor left (ENFILE)",
        Errno::NOBUFS | Errno::NOMEM => "postern has no memory left for a socket",
        _ => return None,
    };
    Some(what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postern_s_own_exhaustion_is_told_apart_from_a_refusing_destination() {
        let own = |n| postern_resource(&std::io::Error::from_raw_os_error(n));
        assert!(own(rustix::io::Errno::MFILE.raw_os_error()).is_some_and(|w| w.contains("EMFILE")));
        assert!(own(rustix::io::Errno::NFILE.raw_os_error()).is_some());
        assert!(own(rustix::io::Errno::CONNREFUSED.raw_os_error()).is_none());
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(postern_resource(&plain).is_none());
    }
}
