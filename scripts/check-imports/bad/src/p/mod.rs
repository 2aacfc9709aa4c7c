mod q;
pub struct P;
pub fn run() { q::thing(); }
