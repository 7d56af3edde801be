//! What the body stack and the client connection share, below both: the drain deadline (`drain`), the
//! connection's flushes a failing body waits for (`flushes`), what an upgraded connection takes past its
//! response (`held`), and futures polled only when woken (`quiet`).

pub mod drain;
pub mod flushes;
pub mod held;
pub mod quiet;
