//! The interrupt vectors the kernel uses: the IDT installs their gates,
//! the local APIC is programmed to deliver them.

/// The local APIC timer's vector.
pub const TIMER_VECTOR: u8 = 0x20;
/// The wake IPI's vector (ends a `wait_until` halt; does nothing else).
pub const WAKE_VECTOR: u8 = 0x40;
/// The local APIC's spurious vector.
pub const SPURIOUS_VECTOR: u8 = 0xFF;
/// Where the (masked) legacy PICs deliver: 16 vectors that just return.
pub const PIC_VECTOR_BASE: u8 = 0xE0;
