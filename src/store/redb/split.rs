//! Shrinking a submit intent the provider cannot take in one job (over its file size or
//! request count): `rules::close::shrink` decides, this writes it.
