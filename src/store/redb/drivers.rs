//! Who drives each provider on redb: the file lock admits one process, so always this one.
