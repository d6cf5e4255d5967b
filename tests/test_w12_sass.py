"""The SASS summary behind the twentieth W12 run's load-order finding (`benchmarks/w12_sass.py`)."""

from __future__ import annotations

from benchmarks.w12_sass import runs

SASS = """
        /*0100*/                   LDG.E.128 R4, desc[UR6][R2.64] ;
        /*0110*/              @!P0 LDG.E.128 R8, desc[UR6][R2.64+0x10] ;
        /*0120*/                   LOP3.LUT R12, R4, 0x87878787, R5, 0xea, !PT ;
        /*0130*/                   SHF.R.W.U32 R13, R4, 0x4, R4 ;
        /*0140*/                   PRMT R14, R8, 0x5140, R12 ;
        /*0150*/                   IMAD.MOV.U32 R15, RZ, RZ, R14 ;
        /*0160*/                   HMMA.16816.F32.BF16 R16, R12, R20, R16 ;
        /*0170*/                   HMMA.16816.F32.BF16 R16, R14, R22, R16 ;
        /*0180*/               @P1 BRA 0x100 ;
        /*0190*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*01a0*/                   STL [R1], R4 ;
"""


def test_runs_counts_each_class_in_order_and_leaves_the_rest_out():
    # two loads (one predicated), three decode ops, the move left out, two MMAs, a branch,
    # a barrier, a spill store
    assert runs(SASS) == "L2 p3 M2 B1 |1 S1"


def test_a_listing_without_the_classes_gives_nothing():
    assert runs("        /*0000*/                   MOV R1, c[0x0][0x28] ;\n") == ""
