pub mod arrow_in;
pub mod driver;
pub mod engine;
pub mod key;
pub mod out;
pub mod table;
pub mod text;
pub mod types;
