//! placeholder
use proc_macro::TokenStream;
/// placeholder
#[proc_macro_attribute]
pub fn redis_lock(_args: TokenStream, item: TokenStream) -> TokenStream { item }
