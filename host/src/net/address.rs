//! Which addresses a request may reach without a grant that names them: the classes live
//! with the rules that name them, in `capstan_caps`.

pub use capstan_caps::{AddressClass, AddressRange};
